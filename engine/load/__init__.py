"""Load tests of any OpenAI-compatible endpoint: profiles, requests, the client, metrics, records.

profiles.py: the rate types and SLOs; requests.py: what is sent (a workload or fixed lengths);
client.py: the asyncio/httpx generator, timed on the client; metrics.py: the definitions;
server_metrics.py: /metrics before and after; run.py: LoadConfig -> `load` records; cli.py: the CLI;
guidellm.py: GuideLLM (in .venv-guidellm) as a second generator, ingested into the same records.
"""
from engine.load.client import Endpoint, probe
from engine.load.metrics import merge, summarize
from engine.load.profiles import SLO, Limits, Profile, parse_profile, parse_slo
from engine.load.run import LoadConfig, prepare, run, run_point, run_sweep_profile, sweep_result

__all__ = ["Endpoint", "probe", "merge", "summarize", "SLO", "Limits", "Profile", "parse_profile", "parse_slo",
           "LoadConfig", "prepare", "run", "run_point", "run_sweep_profile", "sweep_result"]
