"""`python -m tandem.perf.regenerate`: rewrites the derived profiles (`gpus.write_derived_profiles`) in
the package's `profiles/` folder and prints their paths. The only writer of those files."""

from __future__ import annotations

from pathlib import Path

from tandem.perf.gpus import write_derived_profiles


def main() -> None:
    for path in write_derived_profiles(Path(__file__).with_name("profiles")):
        print(path)


if __name__ == "__main__":
    main()
