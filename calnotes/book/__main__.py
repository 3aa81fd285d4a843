"""``python -m calnotes.book list | run CHAPTER | smoke OUT_DIR | results``."""

import sys

from calnotes.book.chapters import main

sys.exit(main())
