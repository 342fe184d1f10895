"""Every check of chapters 00 01 02 03 04 05 is shown to fail (tests/mutation_harness.py)."""

from mutation_harness import make_test

test_every_check_is_shown_to_fail = make_test(["00", "01", "02", "03", "04", "05"])
