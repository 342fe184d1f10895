"""Number the book's chapters from 0, like the notebook files (00_..., 01_...).

Sphinx numbers the chapters of a numbered toctree from 1. This extension runs
after Sphinx (and sphinx-multitoc-numbering) assigned the numbers and subtracts
``chapter_zero_offset`` from the chapter component of every section number and
of every figure/equation number that carries a chapter prefix. The numbers are
recomputed from scratch on every build, so shifting them once per build is safe.
"""

from docutils import nodes


def _shift_numbers(app, env):
    offset = app.config.chapter_zero_offset
    if not offset:
        return []
    shifted = set()  # ids of secnumber lists already shifted (titles share them)

    def shift_list(number):
        if number and id(number) not in shifted:
            number[0] -= offset
            shifted.add(id(number))

    for docname, secnums in env.toc_secnumbers.items():
        for anchor, number in secnums.items():
            if number:
                secnums[anchor] = (number[0] - offset,) + tuple(number[1:])
        for reference in env.tocs[docname].findall(nodes.reference):
            shift_list(reference.get("secnumber"))
        title = env.titles.get(docname)
        if title is not None:
            shift_list(title.get("secnumber"))
        # figure/table/equation numbers are (chapter, counter) in numbered chapters
        for numbers in env.toc_fignumbers.get(docname, {}).values():
            for key, number in numbers.items():
                if len(number) > 1:
                    numbers[key] = (number[0] - offset,) + tuple(number[1:])
    return []


def setup(app):
    app.add_config_value("chapter_zero_offset", 0, "env")
    # priority > 500: run after the toctree collector assigned the numbers
    app.connect("env-get-updated", _shift_numbers, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.0"}
