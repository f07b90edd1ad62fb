"""Data-set layer (docs/theory.md §10): loaders, offline generators, partition, standardisation, cache.

Entry point: [`load_federated`][fedhead.data.load_federated] (``cfg`` from ``conf/dataset/<name>.yaml``). Data-set
modules (gymnasium, h5py, scipy.io, ...) are imported only when their data set is loaded.
"""

from fedhead.analysis.regime import (
    MarginReport,
    OutsideRegimeError,
    OutsideRegimeWarning,
    client_margins,
    ensure_fully_active,
)
from fedhead.data.base import (
    ClientData,
    DataError,
    FederatedData,
    MissingDataError,
    RawDataset,
    batch_to_float,
)
from fedhead.data.config import DatasetConfig, default_cache_dir
from fedhead.data.partition import Partition, designed_partition, eigen_partition, leading_direction
from fedhead.data.pipeline import (
    build_federated,
    cache_file,
    cache_key,
    clear_memo,
    standardize_targets,
)
from fedhead.data.registry import (
    REGISTRY,
    coerce_config,
    config_class,
    data_record,
    dataset_names,
    get_loader,
    load_federated,
    load_raw,
    make_config,
)

__all__ = [
    "ClientData",
    "DataError",
    "DatasetConfig",
    "FederatedData",
    "MarginReport",
    "MissingDataError",
    "OutsideRegimeError",
    "OutsideRegimeWarning",
    "Partition",
    "REGISTRY",
    "RawDataset",
    "batch_to_float",
    "build_federated",
    "cache_file",
    "cache_key",
    "clear_memo",
    "client_margins",
    "coerce_config",
    "config_class",
    "data_record",
    "dataset_names",
    "default_cache_dir",
    "designed_partition",
    "eigen_partition",
    "ensure_fully_active",
    "get_loader",
    "leading_direction",
    "load_federated",
    "load_raw",
    "make_config",
    "standardize_targets",
]
