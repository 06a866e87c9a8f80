"""``python -m samples.attachment_worker``: run the attachment worker."""

import sys

from .worker import main

sys.exit(main())
