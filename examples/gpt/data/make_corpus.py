"""Generate the small training corpus for the GPT example.

The text is original: short paragraphs composed from hand-written word lists and
sentence templates about sailing, weather, cooking and machines, drawn with a fixed
seed so the output is byte-for-byte reproducible.

    python examples/gpt/data/make_corpus.py            # writes corpus.txt next to this file
    python examples/gpt/data/make_corpus.py --check    # verifies corpus.txt is up to date
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

SEED = 1234
TARGET_BYTES = 64_000

# fmt: off
NAMES = [
    "Mara", "Tomas", "Ilse", "Bram", "Nadia", "Oskar", "Lena", "Pim", "Ruth", "Sven",
    "Alba", "Jonas", "Edda", "Felix", "Greta", "Hugo",
]

TOPICS = {
    "sailing": {
        "things": [
            "the mainsail", "the jib", "the tiller", "the anchor chain", "the old sloop",
            "the mooring line", "the compass", "the dinghy", "the mast", "the keel",
            "the chart", "the halyard", "the boom", "the rudder", "the bow line",
        ],
        "places": [
            "the harbour", "the narrow channel", "the outer buoy", "the grey bay",
            "the north pier", "the shallow bank", "the lee of the island", "the open water",
        ],
        "verbs": [
            "trimmed", "checked", "coiled", "raised", "lowered", "mended", "watched",
            "tightened", "eased", "cleaned",
        ],
        "adjs": [
            "salty", "worn", "steady", "wet", "patient", "heavy", "bright", "slack",
        ],
        "facts": [
            "A boat sails best when the sail is eased until it just stops shaking.",
            "The tide turns twice a day, and a careful sailor plans the trip around it.",
            "Reefing early is cheaper than reefing late.",
            "A knot that cannot be untied is a poor knot, however strong it looks.",
            "The wind on the water is rarely the wind the forecast promised.",
            "When the channel is narrow, the slow boat gives way to nobody and everybody.",
            "Every line on deck has one job, and a tidy deck lets it do that job.",
        ],
    },
    "weather": {
        "things": [
            "the clouds", "the rain", "the fog", "the morning frost", "the west wind",
            "the thunder", "the warm front", "the sea breeze", "the hail", "the low sun",
            "the barometer", "the evening sky",
        ],
        "places": [
            "the valley", "the hills", "the coast", "the flat fields", "the town",
            "the ridge", "the marsh", "the river mouth",
        ],
        "verbs": [
            "rolled over", "settled on", "drifted across", "cleared from", "gathered above",
            "crept into", "swept along", "hung over",
        ],
        "adjs": [
            "cold", "damp", "pale", "heavy", "clear", "restless", "soft", "sharp",
        ],
        "facts": [
            "A falling barometer means the weather is about to change.",
            "Fog forms when warm damp air meets a cold surface and gives up its water.",
            "The sea breeze starts in the late morning, once the land is warmer than the sea.",
            "High thin clouds often arrive a day before the rain.",
            "Frost is most likely on a still night under a clear sky.",
            "Thunder follows lightning because sound is slow and light is not.",
            "A ring around the moon is made of ice high in the air.",
        ],
    },
    "cooking": {
        "things": [
            "the onions", "the bread dough", "the soup", "the butter", "the garlic",
            "the rice", "the lentils", "the pan", "the stock", "the apples", "the oven",
            "the sauce", "the flour", "the salt", "the fresh herbs",
        ],
        "places": [
            "the kitchen", "the small galley", "the stove", "the long table",
            "the back room", "the market", "the pantry", "the wooden board",
        ],
        "verbs": [
            "stirred", "chopped", "tasted", "kneaded", "simmered", "roasted", "seasoned",
            "folded", "sliced", "warmed",
        ],
        "adjs": [
            "golden", "thick", "sweet", "fragrant", "crisp", "tender", "smoky", "plain",
        ],
        "facts": [
            "Onions cooked slowly turn sweet; onions cooked fast turn bitter.",
            "Bread needs time more than it needs work.",
            "Salt added early goes into the food; salt added late sits on top of it.",
            "A heavy pan holds its heat and forgives a distracted cook.",
            "Soup is better on the second day, when the flavours have had a night together.",
            "Rest the dough, rest the meat, and rest the cook.",
            "Taste as you go, because the recipe does not know your stove.",
        ],
    },
    "machines": {
        "things": [
            "the engine", "the water pump", "the gearbox", "the old lathe", "the loom",
            "the clock", "the generator", "the winch", "the drive belt", "the bearing",
            "the steam valve", "the printing press", "the flywheel", "the governor",
        ],
        "places": [
            "the workshop", "the engine room", "the mill", "the shed", "the factory floor",
            "the bench", "the boiler house", "the yard",
        ],
        "verbs": [
            "oiled", "adjusted", "rebuilt", "tested", "started", "stopped", "measured",
            "repaired", "balanced", "listened to",
        ],
        "adjs": [
            "noisy", "greasy", "smooth", "rusty", "precise", "tired", "humming", "stubborn",
        ],
        "facts": [
            "A machine that is heard every day tells you when something is wrong.",
            "Oil is cheaper than bearings, and bearings are cheaper than shafts.",
            "The flywheel stores energy between the strokes and keeps the motion even.",
            "A governor opens the valve when the engine slows and closes it when it races.",
            "Measure twice before you cut metal, because metal does not grow back.",
            "Most faults are loose, dirty or dry before they are broken.",
            "A clock is a machine that turns a falling weight into counted time.",
        ],
    },
}

TIMES = [
    "In the morning", "Before dawn", "By noon", "Late in the afternoon", "At dusk",
    "That evening", "On the third day", "After the storm", "Early in spring",
    "In the middle of winter", "Once the work was done", "Before anyone else woke",
]

CONNECT = [
    "and then", "while", "because", "so", "but", "until", "as soon as", "although",
]

CLOSERS = [
    "Nobody said much about it afterwards.",
    "It was the kind of day that is easy to forget and hard to repeat.",
    "The work was slow, but it was done properly.",
    "Later that night the whole thing seemed simple.",
    "There was still a great deal to learn.",
    "It was good enough, and good enough was the plan.",
    "Everyone agreed to try again the next day.",
    "The notebook got one more careful line.",
]

QUOTES = [
    "Slow is smooth, and smooth is fast.",
    "Leave it better than you found it.",
    "Watch first, then touch.",
    "If it smells wrong, it is wrong.",
    "The sea does not care about your schedule.",
    "Patience is a tool too.",
    "A clean bench is half the repair.",
    "Nothing is late if it was never promised.",
]

# fmt: on


def cap(s: str) -> str:
    return s[0].upper() + s[1:]


SINGULAR_S = {"the compass", "the gearbox", "the printing press"}


def be(thing: str) -> str:
    """'was' or 'were', by a crude plural test that is right for the word lists above."""
    plural = thing.endswith("s") and thing not in SINGULAR_S
    return "were" if plural else "was"


def sentence(rng: random.Random, topic: dict, name: str) -> str:
    t = topic
    kind = rng.randrange(9)
    thing = rng.choice(t["things"])
    other = rng.choice([x for x in t["things"] if x != thing])
    place = rng.choice(t["places"])
    verb = rng.choice(t["verbs"])
    adj = rng.choice(t["adjs"])
    adj2 = rng.choice(t["adjs"])
    if kind == 0:
        return f"{rng.choice(TIMES)}, {name} {verb} {thing} near {place}."
    if kind == 1:
        return (
            f"{cap(thing)} {be(thing)} {adj} and {adj2}, "
            f"{rng.choice(CONNECT)} {other} {be(other)} not."
        )
    if kind == 2:
        return rng.choice(t["facts"])
    if kind == 3:
        return f"{name} {verb} {thing}, {rng.choice(CONNECT)} {other} waited by {place}."
    if kind == 4:
        q = rng.choice(QUOTES)
        return f'{name} said, "{q}" Then {name} {verb} {thing} once more.'
    if kind == 5:
        n = rng.randint(2, 12)
        return f"It took {n} {'minute' if rng.random() < 0.5 else 'hour'}s to get {thing} right."
    if kind == 6:
        return f"At {place}, {thing} looked {adj}, and {other} looked {adj2}."
    if kind == 7:
        return f"{name} wrote down what {thing} did, because memory is {adj} and paper is not."
    return f"{cap(other)} had to be {verb} before anything else could happen."


def paragraph(rng: random.Random) -> str:
    topic_name = rng.choice(list(TOPICS))
    topic = TOPICS[topic_name]
    name = rng.choice(NAMES)
    n = rng.randint(3, 6)
    parts = [sentence(rng, topic, name) for _ in range(n)]
    if rng.random() < 0.4:
        parts.append(rng.choice(CLOSERS))
    return " ".join(parts)


def make_corpus(seed: int = SEED, target_bytes: int = TARGET_BYTES) -> str:
    rng = random.Random(seed)
    paras: list[str] = []
    size = 0
    while size < target_bytes:
        p = paragraph(rng)
        paras.append(p)
        size += len(p) + 2
    return "\n\n".join(paras) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("corpus.txt"))
    ap.add_argument("--check", action="store_true", help="fail if the file is out of date")
    args = ap.parse_args()
    text = make_corpus()
    if args.check:
        ok = args.out.exists() and args.out.read_text(encoding="utf-8") == text
        print("corpus.txt is up to date" if ok else "corpus.txt is stale; rerun make_corpus.py")
        return 0 if ok else 1
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({len(text.encode('utf-8'))} bytes, {len(set(text))} distinct chars)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
