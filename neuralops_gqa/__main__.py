"""``python -m neuralops_gqa``: the self-check (``neuralops_gqa.selfcheck``)."""

import sys

from neuralops_gqa.selfcheck import main

sys.exit(main())
