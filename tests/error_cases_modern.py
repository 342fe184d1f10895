"""Bad-input cases for the modern chapter's components, collected by test_backends_errors.py.

Each case is (name, args, kwargs, message regex), as CASES there.
"""

CASES: list = []
