# calnotes: `make book` and `make test` set everything up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CHAPTER ?=
ARGS ?=
DEVICE ?= auto
PRESET ?=

.PHONY: help setup data fonts test test-unit test-chapters test-reruns test-cluster book check-book run results claims-cache bench lint times clean

help:
	@echo "make book      execute every chapter (default parameters) and build _build/html"
	@echo "make check-book  open every built page in headless Chromium, offline, and check it"
	@echo "make test      unit tests, then every chapter in SMOKE mode (papermill + nbval)"
	@echo "make run CHAPTER=01 ARGS='-p EPOCHS 5 -p DEVICE cuda'   rerun one chapter"
	@echo "make results [DEVICE=cuda] [CHAPTER=02] [ARGS='-p NAME VALUE']   compute the stored runs the book loads (resumable)"
	@echo "make results PRESET=paper DEVICE=cuda   the papers' scale (RAY_ADDRESS: on a cluster)"
	@echo "make claims-cache  evaluate the claims of every chapter whose runs or code changed (before committing runs)"
	@echo "make bench     speed comparisons against peers (benchmarks/)"

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[book,test,check,dev,ray]'
	touch $@

setup: $(STAMP)

data: setup
	$(PY) -m calnotes.data fetch mnist fashion_mnist animals letters

test: test-unit test-chapters

test-unit: setup data
	$(PY) -m pytest tests

# papermill injects SMOKE=True into each chapter; nbval executes and checks it.
# pytest exits 5 when it collects nothing, so a missing chapter fails the target.
test-chapters: setup data
	rm -rf _build/smoke
	$(PY) -m calnotes.book smoke _build/smoke
	$(PY) -m pytest -p no:cacheprovider --nbval-lax --nbval-current-env _build/smoke \
	  --junitxml=_build/smoke-junit.xml

# Every chapter at SMOKE size with other parameters, as a reader reruns it (the tests
# marked `chapters`, which test-unit leaves out; .ci/run runs them on a second kernel family).
test-reruns: setup data
	$(PY) -m pytest -p no:cacheprovider -m chapters tests

# The chapters quote Chinese as well as Russian: a font with CJK glyphs (the Debian
# package fonts-wqy-microhei, a 1.6 MB download) lets a browser without one draw them instead of
# empty boxes. Installed once; the book builds without it, check-book fails without it.
CJK_FONT := fonts-wqy-microhei
fonts:
	@dpkg -s $(CJK_FONT) >/dev/null 2>&1 || (apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(CJK_FONT))

# The tests marked `cluster`: a Ray head and a second node on 127.0.0.1 (no dashboard, no
# usage reporting) training runs while one node's worker is killed; each paper-scale
# preset at tiny size on files in the CIFAR/SVHN formats, through Ray on this machine.
test-cluster: setup data
	RAY_USAGE_STATS_ENABLED=0 $(PY) -m pytest -p no:cacheprovider -m cluster tests

book: setup data
	@$(MAKE) --no-print-directory fonts || echo "warning: $(CJK_FONT) not installed: a browser without a CJK font draws the Chinese quotes as boxes"
	rm -rf _build/html _build/.doctrees _build/jupyter_execute _build/.jupyter_cache
	$(VENV)/bin/jupyter-book build . -W -n --keep-going

# Every page of _build/html in headless Chromium with the network off: formulas typeset,
# images loaded, nothing cut off or scrolling sideways at 1280 px and 390 px, no display
# equation needing a scrollbar at 1280 px, no character drawn as an empty box.
check-book: setup fonts
	@test -f _build/html/book/index.html || (echo "no built book: run make book first"; exit 2)
	@command -v chromium >/dev/null || (apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium)
	$(PY) tools/check_book.py _build/html

run: setup data
	@test -n "$(CHAPTER)" || (echo "usage: make run CHAPTER=<name> ARGS='-p NAME VALUE ...'"; exit 2)
	$(PY) -m calnotes.book run $(CHAPTER) $(ARGS)

results: setup data
	$(PY) -m calnotes.book results -p DEVICE $(DEVICE) $(if $(PRESET),--preset $(PRESET)) $(if $(CHAPTER),--chapter $(CHAPTER)) $(ARGS)

# The committed claims cache keyed by the runs and code it read: a commit that adds runs or
# changes the library runs this first, or the book evaluates those chapters while it builds.
claims-cache: setup
	$(PY) tools/claims_cache.py --jobs 2

bench: setup data
	$(PY) benchmarks/run_all.py

# The pages' execution times of the last `make test` and `make book` (SMOKE cells from the
# JUnit report, the book's parameters from Jupyter Book's execution cache), with the machine
# and commit, into book/chapter_times.json: the chapters' "In this chapter" boxes quote them.
times: setup
	$(PY) tools/chapter_times.py

lint: setup
	$(VENV)/bin/ruff check calnotes tests benchmarks
	$(VENV)/bin/mypy calnotes

clean:
	rm -rf _build .pytest_cache .hypothesis
