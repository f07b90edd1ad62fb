"""Entry points: ``fedhead-run``, ``fedhead-ufm``, ``fedhead-data``, ``fedhead-sweep``, ``fedhead-report``,
``fedhead-predict`` and ``fedhead-keys``."""
