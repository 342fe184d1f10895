"""An instructor's policies for the graded exercises, read by the grader (``tfbook.course.policies``),
never by the chapter notebooks.

``FORBIDDEN``: {test cell grade_id: policy}. An answer that refers to one of ``calls`` (the object a
dotted name stands for, however it was imported and by whichever module path reaches it:
``tnp.softmax``, ``from tfbook.numpy import softmax as s``, ``tfbook.numpy.attention.softmax``; the
grader matches objects, so one name per function is enough) or calls
a method named in ``methods`` (``x.softmax(...)``), in its answer cell or in any cell the student
added or changed, scores at most ``points`` for that exercise, with ``reason`` in grades.csv and on
the feedback page. The check reads the student's source (it cannot see a name built at run time,
``getattr(tnp, "soft" + "max")``): a deterrent with a stated rule, not a proof.
"""

FORBIDDEN = {
    "ex0-1-softmax-tests": {
        "calls": ["tfbook.numpy.softmax", "tfbook.numpy.log_softmax", "tfbook.torch.functional.softmax",
                  "tfbook.torch.functional.log_softmax", "scipy.special.softmax", "scipy.special.log_softmax",
                  "torch.softmax", "torch.nn.functional.softmax", "torch.nn.Softmax", "torch.special.softmax",
                  "torch.log_softmax", "torch.nn.functional.log_softmax", "torch.nn.LogSoftmax",
                  "torch.special.log_softmax"],
        "methods": ["softmax", "log_softmax"],
        "points": 0,
        "reason": "the answer uses a library's softmax; the exercise asks you to implement it (instructor's rule: 0 points)",
    },
    "ex8-1-rms-norm-tests": {
        "calls": ["tfbook.numpy.rms_norm", "tfbook.torch.functional.rms_norm", "torch.nn.functional.rms_norm",
                  "torch.nn.RMSNorm", "tfbook.torch.modules.RMSNorm", "tfbook.torch.modern.RMSNorm"],
        "methods": [],
        "points": 0,
        "reason": "the answer uses a library's RMS norm; the exercise asks you to implement it (instructor's rule: 0 points)",
    },
    "ex18-1-buckets-tests": {
        "calls": ["tfbook.parallel.ddp_buckets"],
        "methods": [],
        "points": 0,
        "reason": "the answer calls tfbook.parallel.ddp_buckets, the rule the test grades by; the exercise asks you "
                  "to implement it (instructor's rule: 0 points)",
    },
}
