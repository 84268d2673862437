import sys

from vllm_fork.cli.main import main

sys.exit(main())
