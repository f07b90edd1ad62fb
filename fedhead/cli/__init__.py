"""Entry points: ``fedhead-run``, ``fedhead-ufm``, ``fedhead-data``, ``fedhead-sweep`` and ``fedhead-report``."""
