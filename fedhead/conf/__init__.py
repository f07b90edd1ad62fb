"""Hydra configuration tree of fedhead (a package so that ``pkg://conf`` finds it when installed)."""
