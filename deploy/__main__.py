import sys

from deploy.stack import main

sys.exit(main())
