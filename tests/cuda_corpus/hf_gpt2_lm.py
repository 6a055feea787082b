"""A Hugging Face GPT-2 language model (a small config) trained on "cuda:0", then sampled
greedily."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
torch.cuda.manual_seed(0)
config = GPT2Config(
    vocab_size=50, n_positions=32, n_embd=48, n_layer=2, n_head=4,
    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
)  # fmt: skip
model = GPT2LMHeadModel(config).to("cuda:0")
g = torch.Generator().manual_seed(7)
ids = torch.randint(0, 50, (2, 16), generator=g).to("cuda:0")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    opt.zero_grad()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
with torch.no_grad():
    next_token = model(input_ids=ids).logits[:, -1].argmax(-1)
print(f"DEVICE {next_token.device}")
print(f"LOSS {loss.item():.6f}")
