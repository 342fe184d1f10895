# The single entry point. Everything runs inside .venv, created from requirements.txt.
#   make book         build the book into _build/html (installs what it needs first)
#   make course-book  build the course edition (no solutions) into _build/course/html
#   make pdf          the whole book as one PDF, _build/pdf/tfbook.pdf (XeLaTeX; `make book` after it links it)
#   make test         run the whole test suite (installs what it needs first)
#   make release      student notebooks (no solutions, no hidden tests) into _build/release
#   make grade SUBMISSIONS=folder   autograde a folder of submissions into _build/grades
#                                   (sharded: python -m tfbook.course plan ... --out plan.json, then SHARD=k/N PLAN=plan.json)
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv book course-book mathjax chromium test test-profile-b clean release grade pdf latex

# The pinned requirements need Python >= 3.11 (checked first, with a hint). PyTorch's build:
# tools/torch_choice.py prints the pip arguments of a step run before the requirements, from
# TORCH_VARIANT=auto|default|cpu|cuda (auto, the default: the CPU build unless `nvidia-smi -L`
# lists a GPU, falling back to default where PyTorch's CPU index cannot be reached, as on CI's
# mirror-only network; default: nothing printed, nothing detected, torch from the requirements).
TORCH_VARIANT ?= auto
PY_FLOOR_CHECK := -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'
$(STAMP): requirements.txt pyproject.toml tools/torch_choice.py
	@py="$(PYTHON)"; test -x $(BIN)/python && py=$(BIN)/python; \
	test -n "$$py" && "$$py" $(PY_FLOOR_CHECK) || { \
	  echo "error: tfbook needs Python >= 3.11 (its pinned requirements have no wheels for older ones);" \
	       "'$${py:-python3}' is $$($${py:-python3} -V 2>&1 || echo missing)." \
	       "Choose another, e.g. make venv PYTHON=python3.12 (delete .venv first if it was made with the old one)." >&2; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	torch_args="$$(TORCH_VARIANT=$(TORCH_VARIANT) $(BIN)/python tools/torch_choice.py)" && \
	  { test -z "$$torch_args" || $(BIN)/python -m pip install --quiet $$torch_args; }
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	# nbgrader's JupyterLab extension is built for Lab 4.6 (requirements.txt); the course uses nbgrader's
	# command line only, so the extension is turned off in this venv (tests/test_lab_extensions.py)
	$(BIN)/jupyter labextension disable --level=sys_prefix @jupyter/nbgrader
	touch $(STAMP)

venv: $(STAMP)

# ---- the book ---------------------------------------------------------------------
# Both editions are staged by tools/stage_book.py (solutions folded or removed, hidden
# tests stripped), built with warnings as errors, and moved into _build only when the
# build succeeded. The notebooks are rendered as committed (never executed here);
# tools/check_notebooks.py refuses notebooks not run top to bottom or with errors.
JB_FLAGS := -W -n --keep-going
NOTEBOOKS ?= notebooks
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_INSTALL := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends
MATHJAX := _vendor/mathjax/tex-chtml.js

$(MATHJAX): tools/vendor_mathjax.sh
	command -v npm >/dev/null || { $(SUDO) apt-get update -qq && $(APT_INSTALL) npm; }
	tools/vendor_mathjax.sh

mathjax: $(MATHJAX)

book: $(STAMP) $(MATHJAX)
	rm -rf _build/html _build/.doctrees _build/jupyter_execute _stage/public
	$(BIN)/python tools/check_notebooks.py $(NOTEBOOKS)
	$(BIN)/python tools/stage_book.py --mode public --out _stage/public --notebooks $(NOTEBOOKS) --pdf $(PDF)
	$(BIN)/jupyter-book build _stage/public --path-output _stage/public $(JB_FLAGS)
	mkdir -p _build && mv _stage/public/_build/html _build/html

course-book: $(STAMP) $(MATHJAX)
	rm -rf _build/course _stage/course
	$(BIN)/python tools/check_notebooks.py $(NOTEBOOKS)
	$(BIN)/python tools/stage_book.py --mode course --out _stage/course --notebooks $(NOTEBOOKS)
	$(BIN)/jupyter-book build _stage/course --path-output _stage/course $(JB_FLAGS)
	mkdir -p _build/course && mv _stage/course/_build/html _build/course/html

# The whole book as one PDF, _build/pdf/tfbook.pdf: the public edition through Sphinx's LaTeX
# builder and XeLaTeX (Debian's TeX Live, installed like chromium). `make book` run after it
# copies the PDF into the site and links it from every page; without it the site has no link.
PDF := _build/pdf/tfbook.pdf
TEX_PACKAGES := texlive-xetex texlive-latex-recommended texlive-latex-extra texlive-fonts-recommended \
	latexmk xindy fonts-freefont-otf fonts-dejavu-core lmodern tex-gyre
latex:
	command -v xelatex >/dev/null && command -v latexmk >/dev/null && command -v xindy >/dev/null \
	  && test -d /usr/share/fonts/opentype/freefont || { $(SUDO) apt-get update -qq && $(APT_INSTALL) $(TEX_PACKAGES); }

pdf: $(STAMP) $(MATHJAX) latex
	rm -rf _stage/pdf $(PDF)
	$(BIN)/python tools/check_notebooks.py $(NOTEBOOKS)
	$(BIN)/python tools/stage_book.py --mode pdf --out _stage/pdf --notebooks $(NOTEBOOKS)
	$(BIN)/jupyter-book build _stage/pdf --path-output _stage/pdf --builder pdflatex -n --keep-going
	mkdir -p $(dir $(PDF)) && cp _stage/pdf/_build/latex/tfbook.pdf $(PDF)
	@echo "make pdf: $(PDF), $$(du -h $(PDF) | cut -f1)"

# ---- tests --------------------------------------------------------------------------
# Headless Chromium for tests/test_book_browser.py (Debian's package).
chromium:
	test -x /usr/bin/chromium || { $(SUDO) apt-get update -qq && $(APT_INSTALL) chromium fonts-dejavu-core; }

# Both book builds run first; a failed build leaves no site, which the book tests
# report, so every failure ends up in pytest's summary, the last line printed.
# nbval re-executes every notebook (strict: all outputs compared, after
# nbval_sanitize.cfg), one notebook per worker (--dist loadfile). .venv/bin goes first
# on PATH for the command-line tools the tests start (nbgrader runs `alembic`).
NBVAL_FLAGS := --nbval --nbval-current-env --nbval-sanitize-with nbval_sanitize.cfg --nbval-cell-timeout 300
# Two pytest workers share two cores, so each kernel and test process uses one BLAS/OpenMP
# thread: oversubscribed OpenBLAS threads spin and make small matrix products 30-50x slower.
ONE_THREAD := OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
# The second numerical profile: every notebook once more, as another reader's machine would
# compute it: PyTorch's generic kernels instead of its AVX2/AVX-512 ones, OpenBLAS's
# Sandybridge kernels (no FMA) for NumPy, MKL's conservative code path and oneDNN without
# wide vectors for PyTorch's products, and two threads instead of one (other reduction
# orders). An output that changes under it depends on the machine and fails here, not on a
# reader's laptop (CONTRIBUTING.md, "Outputs that do not depend on the machine").
# OMP_WAIT_POLICY=PASSIVE changes no number, only how an idle OpenMP thread waits: the two
# notebooks that run at once (-n 2) have four threads for two cores, and spinning threads
# burned their CPU (a 200-step training loop at load 6-9: 11-26 CPU-s spinning, 3.3 passive).
PROFILE_B := ATEN_CPU_CAPABILITY=default OPENBLAS_CORETYPE=Sandybridge MKL_CBWR=COMPATIBLE \
	ONEDNN_MAX_CPU_ISA=SSE41 OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 MKL_NUM_THREADS=2 \
	OMP_WAIT_POLICY=PASSIVE
# Both runs always happen; the target fails if either failed. The whole suite runs last, so
# its summary is the last line printed.
# --durations=25: the 25 slowest tests and notebook cells, printed above that summary (the
# command must stay under 20 minutes; this says where the time goes).
test: $(STAMP) chromium bwrap sevenzip
	-$(MAKE) --no-print-directory book
	-$(MAKE) --no-print-directory course-book
	@status=0; \
	echo "== make test 1/2: every notebook under the second numerical profile: $(PROFILE_B)"; \
	$(MAKE) --no-print-directory test-profile-b || status=1; \
	echo "== make test 2/2: the whole test suite"; \
	$(ONE_THREAD) PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -n 2 --dist loadfile --durations=25 $(NBVAL_FLAGS) tests notebooks || status=1; \
	exit $$status

# The notebooks alone under the second profile (one process with two threads).
test-profile-b: $(STAMP) sevenzip
	$(PROFILE_B) PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -p no:cacheprovider -n 2 --dist loadfile $(NBVAL_FLAGS) notebooks

# A reader's install, tried: a fresh venv made only from `pip install "tfbook[book]"` (a wheel of
# this checkout, dependencies from the package registry: needs the network, several GB, minutes)
# runs chapters 3, 11 and 13 under nbval (tests/test_fresh_env.py; make test skips it, offline).
# FRESH_ENV_CHAPTERS="03 11 13" picks others; FRESH_ENV_KEEP=DIR keeps the environment and report
# (FRESH_ENV_REUSE=1 reuses a kept one); FRESH_ENV_REF=HEAD tests a commit, not the working tree.
.PHONY: fresh-env-check
fresh-env-check: $(STAMP)
	TFBOOK_FRESH_ENV=1 $(if $(FRESH_ENV_CHAPTERS),TFBOOK_FRESH_ENV_CHAPTERS="$(FRESH_ENV_CHAPTERS)") \
	  $(if $(FRESH_ENV_KEEP),TFBOOK_FRESH_ENV_KEEP="$(FRESH_ENV_KEEP)") \
	  $(if $(FRESH_ENV_REUSE),TFBOOK_FRESH_ENV_REUSE="$(FRESH_ENV_REUSE)") \
	  $(if $(FRESH_ENV_REF),TFBOOK_FRESH_ENV_REF="$(FRESH_ENV_REF)") \
	  $(BIN)/python -m pytest -q -s -p no:cacheprovider tests/test_fresh_env.py::test_fresh_book_install_runs_chapters_clean

# ---- graded exercises (see the README, "Graded exercises") -------------------------
#   make release                          student notebooks into _build/release/<chapter>/
#   make grade SUBMISSIONS=path/to/folder [TIMEOUT=60] [JOBS=<cores>] [SHARD=k/N PLAN=plan.json]
#                                         grades.csv, exercises.csv/.png, feedback/ in _build/grades/
# Every submission runs in a bubblewrap sandbox (Debian's package, installed here like
# chromium for the tests). nbgrader (release) starts `alembic` from PATH: venv bin first.
TIMEOUT ?= 60
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
.PHONY: bwrap

bwrap:
	command -v bwrap >/dev/null || { $(SUDO) apt-get update -qq && $(APT_INSTALL) bubblewrap; }

# 7-Zip's PPMd, the strongest classical baseline of chapter 13 (tfbook.ngram.compressed_bits):
# Debian's 7zip package, whose program is 7zz, and zpaq (chapter 13's context-mixing baseline)
.PHONY: sevenzip
sevenzip:
	command -v 7zz >/dev/null || { $(SUDO) apt-get update -qq && $(APT_INSTALL) 7zip; }
	command -v zpaq >/dev/null || { $(SUDO) apt-get update -qq && $(APT_INSTALL) zpaq; }

release: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m tfbook.course release

grade: $(STAMP) bwrap
	@test -n "$(SUBMISSIONS)" || { echo "usage: make grade SUBMISSIONS=path/to/folder [TIMEOUT=60] [JOBS=2] [SHARD=k/N PLAN=plan.json]" >&2; exit 2; }
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m tfbook.course grade "$(SUBMISSIONS)" --timeout "$(TIMEOUT)" --jobs "$(JOBS)" $(if $(SHARD),--shard "$(SHARD)" --out "_build/grades-$(subst /,-of-,$(SHARD))") $(if $(PLAN),--plan "$(PLAN)")

clean:
	rm -rf _build _stage _vendor
