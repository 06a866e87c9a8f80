"""``python -m pubsub_worker.cli``: the ``pubsub-worker`` command."""

import sys

from . import main

sys.exit(main())
