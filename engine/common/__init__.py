"""What every layer shares: the UserError type, the vocabulary, the formulas and the paths.

Imports nothing else of engine, so any package may import it.
"""
from engine.common.errors import UserError
from engine.common.formulas import (DEFAULT_USD_PER_HOUR, HOURS_PER_MONTH, check_price, expected_length,
                                    kv_bytes_per_token, usd_per_million_tokens)
from engine.common.paths import DATA, REPO_ROOT, cache_dir, data_dir
from engine.common.vocab import (DESCRIPTIONS, DRAFT_KINDS, GROUP_SIZES, MODEL_ALIASES, PRECISIONS,
                                 canonical_model_name, parse_precision)

__all__ = ["UserError", "DEFAULT_USD_PER_HOUR", "HOURS_PER_MONTH", "check_price", "expected_length",
           "kv_bytes_per_token", "usd_per_million_tokens", "DATA", "REPO_ROOT", "cache_dir", "data_dir",
           "DESCRIPTIONS", "DRAFT_KINDS", "GROUP_SIZES", "MODEL_ALIASES", "PRECISIONS", "canonical_model_name",
           "parse_precision"]
