# nbgrader 0.9 configuration for the tfbook course.
#
# `python -m tfbook.course release` copies this file into a temporary nbgrader course
# directory and runs nbgrader's generate_assignment there; the chapter notebooks in
# notebooks/ are the "source" (master) notebooks, and the assignment name is the
# notebook stem. `python -m tfbook.course grade` does NOT use nbgrader's autograde or
# generate_feedback (they run student code and hidden tests in one kernel with the
# grader's rights; see the README, "Graded exercises"): it sandboxes every submission.
# The autograde/feedback settings below only matter to an instructor who drives
# nbgrader by hand, and that way is not safe against a hostile submission.
from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import GetGrades

from tfbook.course.release import HideHiddenTests  # feedback must not show hidden tests

c = get_config()  # noqa: F821  (provided by traitlets when nbgrader loads this file)

# What a student sees where a solution was.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# Autograding: each cell may run this long (seconds) before the kernel is interrupted
# and the cell is recorded as failed; `tfbook.course grade --timeout` overrides it.
c.Execute.timeout = 60
c.Execute.interrupt_on_timeout = True

# Students may reorder nothing that is graded, but the batch must survive anything.
c.Autograde.create_student = True

# Feedback pages: remove the hidden-test regions (nbgrader 0.9 keeps them in the
# autograded notebook that feedback is rendered from) and reduce tracebacks of cells
# that had hidden tests to their last line, with any hidden-test text scrubbed.
c.GenerateFeedback.preprocessors = [
    HideHiddenTests,
    GetGrades,
    CSSHTMLHeaderPreprocessor,
]
