"""A Hugging Face BERT classifier (a small config, nothing downloaded), fine-tuned on CUDA."""

import torch
from transformers import BertConfig, BertForSequenceClassification

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
if torch.cuda.is_available():
    torch.cuda.manual_seed(0)
config = BertConfig(
    vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
    intermediate_size=128, max_position_embeddings=32, num_labels=3,
    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
)  # fmt: skip
model = BertForSequenceClassification(config).to(device)
g = torch.Generator().manual_seed(6)
ids = torch.randint(0, 64, (4, 12), generator=g).to(device)
labels = torch.randint(0, 3, (4,), generator=g).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model.train()
for step in range(3):
    opt.zero_grad()
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    opt.step()
model.eval()
with torch.no_grad():
    logits = model(input_ids=ids).logits
print(f"DEVICE {logits.device}")
print(f"LOSS {loss.item():.6f}")
