"""tests/test_cache_stateful.py's machine with many more examples (its own settings fix 60)."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tests"))
from hypothesis import HealthCheck, Phase, settings
import test_cache_stateful as m

TestDeep = m.KVCacheMachine.TestCase
TestDeep.settings = settings(max_examples=1500, stateful_step_count=40, deadline=None,
                             phases=[p for p in Phase if p != Phase.explain],
                             suppress_health_check=list(HealthCheck))
