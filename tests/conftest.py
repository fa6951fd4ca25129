import os
import sys

# Let integration tests `import harness` and unit tests import helpers next to them.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "integration"))
