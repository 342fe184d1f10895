"""Hidden cases of chapter 24 (see README.md in this folder)."""

HIDDEN = {
    "ex24-1-mask-tests": {
        "A": "twenty random conversations of one to three turns, against the chapter's answer_targets",
        "B": "an empty answer: only the assistant token's prediction of the end of turn is scored",
    },
    "ex24-2-share-tests": {"C": "the predicted share of the longest answer in a token-mean loss"},
    "ex24-3-positions-tests": {
        "D": "thirty conversations of random lengths, against document_positions",
        "E": "no conversation at all gives an empty array",
    },
}
