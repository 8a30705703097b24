"""Rewrites tests/data/drafters/oracle/exclusions.json from the measured records: each variant where the doctor and
the engine differ, of an edit family whose defect the files cannot show (oracle_variants.INVISIBLE), is recorded
with both sides. A difference of any other family is printed and left unexplained (the record test then fails on
it).

    python bench/drafter_oracle_exclusions.py
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from specdeploy.testing import oracle, oracle_mla  # noqa: E402
from specdeploy.testing.oracle_variants import INVISIBLE, family  # noqa: E402


def main() -> int:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for p in sorted(oracle.RECORDS.glob("vllm-*.json")):
            rec = json.loads(p.read_text())
            vs, write_sparse_pair = oracle_mla.variant_set(rec)
            for name, row in sorted(rec["variants"].items()):
                if name not in vs:
                    continue
                t, d = write_sparse_pair(vs[name], Path(tmp))
                doc = oracle.doctor(d, t, rec["release"])
                if oracle.agrees(doc["errors"], row["verdict"]):
                    continue
                fam = family(name)
                if fam is None:
                    print(f"UNEXPLAINED {rec['release']} {name}: oracle {row['verdict']} doctor {doc['errors']}")
                    continue
                out.append({"name": name, "release": rec["release"], "doctor": doc["errors"],
                            "oracle": row["verdict"], "why": fam, **({"set": rec["set"]} if rec.get("set") else {})})
    path = oracle.RECORDS / "exclusions.json"
    path.write_text(json.dumps({"why": INVISIBLE, "exclusions": out}, indent=1) + "\n")
    print(f"{len(out)} exclusions written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
