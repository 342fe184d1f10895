"""Hidden cases of chapter 13 (see README.md in this folder)."""

HIDDEN = {
    "ex13-1-next-digit-tests": {
        "A": "sums with carries in every column, in none, and a carry out of the last column",
        "B": "operands with more digits: every position of many problems",
        "C": "one-digit operands, the final carry included",
        "D": "a wrong digit already written in a later column: the carry is read from it, not recomputed",
    },
    "ex13-2-greedy-tests": {
        "E": "a batch of one-token prompts",
        "F": "no new tokens: the prompt comes back unchanged",
        "G": "a model that reads the whole text, from prompts of one token",
    },
    "ex13-3-confident-loss-tests": {"H": "the predicted loss"},
    "ex13-4-operand-floor-tests": {"I": "the predicted floor"},
}
