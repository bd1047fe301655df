"""``python -m remote`` (in the Ray job's working_dir) or ``python -m nemo_rl_gke.remote``: the validator's CLI."""

import sys

from .cli import main

sys.exit(main())
