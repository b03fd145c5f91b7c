"""Record, per catalog entry without an analytic counter, what its meta-device build says (``counted``).

A catalogued model then resolves from data/architectures.json alone: no ``import transformers`` (a cold import costs
~17 s) and no torch. The build is the one perfguide itself runs for such a config (the transformers class named in
``architectures``, on the meta device); tests/test_catalog_counted.py rebuilds every entry and requires the recorded
facts to equal the fresh ones, so a config edit without a re-run fails there.

    .venv/bin/python scripts/catalog_counts.py          # rewrite the counted blocks
    .venv/bin/python scripts/catalog_counts.py --check  # exit 1 when a recorded block differs from a fresh build
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "perfguide" / "data" / "architectures.json"


def fresh_facts(hub_id: str) -> dict[str, Any] | None:
    """The meta-device facts of ``hub_id``'s config, or None when an analytic counter covers it."""
    from perfguide.model.catalog import config_of
    from perfguide.model.counting import analytic_count
    from perfguide.model.from_module import _config_dict, _hf_config, module_facts

    config = config_of(hub_id)
    if analytic_count(config) is not None:
        return None
    import torch
    import transformers

    hf = _hf_config(config)
    arch = config["architectures"][0]
    with torch.device("meta"):
        module = getattr(transformers, arch)._from_config(hf)
    return module_facts(module, _config_dict(module)).model_dump(mode="json")


def main(argv: list[str]) -> int:
    from perfguide.model.catalog import catalog_names

    data = json.loads(DATA.read_text(encoding="utf-8"))
    stale = []
    for hub_id in catalog_names():
        facts = fresh_facts(hub_id)
        entry = data["models"][hub_id]
        if entry.get("counted") != facts:
            stale.append(hub_id)
            if facts is None:
                entry.pop("counted", None)
            else:
                entry["counted"] = facts
    if "--check" in argv:
        print("\n".join(f"stale: {h}" for h in stale) or "all counted blocks match a fresh meta-device build")
        return 1 if stale else 0
    text = json.dumps(data, indent=1, ensure_ascii=False)
    # a block kind's layer indices on one line, not one per line
    text = re.sub(r'"layers": \[([\d,\s]*)\]', lambda m: '"layers": [' + " ".join(m.group(1).split()) + "]", text)
    DATA.write_text(text + "\n", encoding="utf-8")
    print(f"rewrote {len(stale)} counted block(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
