"""ctest's entry for the Python suite: runs pytest on python/tests with the freshly built module first on
sys.path. Exits 77 (ctest's skip code here) when pytest is not installed, so a machine without
python3-pytest skips the suite instead of failing it."""
import os
import sys

build_dir = sys.argv[1]
try:
    import pytest
except ImportError:
    print("SKIP: pytest is not installed (apt-get install python3-pytest)")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [build_dir, os.environ.get("PYTHONPATH")]))
sys.path.insert(0, build_dir)
# no cache directory: the source tree stays clean
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", here] + sys.argv[2:]))
