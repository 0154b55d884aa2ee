"""`python -m asyncrl.eval MODEL [CONFIG.toml] ...`: see asyncrl.eval.offline."""

import sys

from asyncrl.eval.offline import main

sys.exit(main())
