"""Every check of chapters 06 07 08 09 10 is shown to fail (tests/mutation_harness.py)."""

from mutation_harness import make_test

test_every_check_is_shown_to_fail = make_test(["06", "07", "08", "09", "10"])
