"""Bad-input cases for the training chapter's components, collected by test_backends_errors.py.

Each case is (name, args, kwargs, message regex), as CASES there.
"""

CASES: list = []
