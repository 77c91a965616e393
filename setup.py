"""Maps the repository's top-level folders onto one import namespace, kvscope.*."""

from setuptools import find_packages, setup

# Each folder is installed as kvscope.<folder>; tests/ and scripts/ are not installed.
ROOTS = (
    "cli",
    "model",
    "connector",
    "traces",
    "backend",
    "dashboard",
    "demo",
    "bench",
    "verify",
    "harness",
)

packages: list[str] = []
package_dir: dict[str, str] = {}
for root in ROOTS:
    found = find_packages(where=".", include=[root, f"{root}.*"])
    if found:
        package_dir[f"kvscope.{root}"] = root
        packages += [f"kvscope.{name}" for name in found]

setup(packages=packages, package_dir=package_dir)
