"""Makes the dist-info that `pip install` wrote describe the package that ships it, jax-aiter-core.

    python dist_info.py PREFIX        (recipe/build.sh, after pip)

The package outputs of recipe.yaml split the installed files; the dist-info travels with jax-aiter-core. Its RECORD
keeps only jax-aiter-core's files: jax_aiter/mha/ and the attention libraries ship in jax-aiter-mha, jax_aiter/lib/aiter/
in aiter-jit-libs (the same paths as the `files` globs of recipe.yaml). direct_url.json, which names the directory
the build ran in, is removed.
"""

from __future__ import annotations

import csv
import fnmatch
import io
import sys
from pathlib import Path

# RECORD paths (relative to site-packages) of files that other outputs ship.
OTHER_OUTPUTS = ("jax_aiter/mha/*", "jax_aiter/lib/libjax_aiter_*mha*", "jax_aiter/lib/aiter/*")


def main(prefix: Path) -> None:
    (dist_info,) = prefix.glob("lib/python*/site-packages/jax_aiter-*.dist-info")
    direct_url = dist_info / "direct_url.json"
    direct_url.unlink(missing_ok=True)
    record = dist_info / "RECORD"
    rows = list(csv.reader(io.StringIO(record.read_text())))
    dropped = {f"{dist_info.name}/direct_url.json"}
    kept = [row for row in rows if row and row[0] not in dropped
            and not any(fnmatch.fnmatch(row[0], pattern) for pattern in OTHER_OUTPUTS)]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(kept)
    record.write_text(out.getvalue())
    print(f"dist_info.py: {record.relative_to(prefix)} keeps {len(kept)} of {len(rows)} entries")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
