"""Every check of chapter 26 is shown to fail (tests/mutation_harness.py)."""

from mutation_harness import make_test

test_every_check_is_shown_to_fail = make_test(["26"])
