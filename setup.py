"""Packages of the wheel: ``loadlab*`` plus each top-level data folder as ``loadlab.<folder>``.

The repository keeps shipped data (workload profiles, scenarios) in top-level folders where
users edit them; a wheel carries each inside the package, where
:func:`loadlab.spec.datafiles.data_dir` finds it once installed. Everything else is in
pyproject.toml.
"""

from setuptools import find_packages, setup

# folder: the files of it to ship
DATA_FOLDERS = {"profiles": ["*.yaml", "README.md"], "scenarios": ["*.yaml", "README.md"]}

setup(
    packages=[*find_packages(include=["loadlab*"]), *(f"loadlab.{d}" for d in DATA_FOLDERS)],
    package_dir={f"loadlab.{d}": d for d in DATA_FOLDERS},
    package_data={"loadlab": ["py.typed", "report/templates/*", "analyze/arbiter.json"],
                  **{f"loadlab.{d}": files for d, files in DATA_FOLDERS.items()}},
)
