"""The options of ``dataset=table`` ([`TableConfig`][fedhead.data.table_config.TableConfig]) and their
checks: the options alone when the object is built (a constraint table, no file access), the
files in [`TableConfig.preflight`][fedhead.data.table_config.TableConfig.preflight] before anything
starts. What the options mean: [`fedhead.data.table`][fedhead.data.table].
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from fedhead.analysis.constraints import Field, Together, check, integer, names, number, one_of, optional
from fedhead.analysis.standardization import INPUT_MODES, TARGET_MODES
from fedhead.data.config import DatasetConfig
from fedhead.data.table_files import SUFFIXES, TableError, read_file, site_values

__all__ = ["TableConfig", "TableError"]

_PARTITIONS = ("natural", "eigen")
_MISSING = ("refuse", "drop")


#: The options' rules, in the order they are checked (one message each: key, value, what is allowed).
_RULES = (
    Field("standardize_targets", one_of(TARGET_MODES), f"must be one of {TARGET_MODES}"),
    Field("standardize_inputs", one_of(INPUT_MODES), f"must be one of {INPUT_MODES}"),
    Together(
        lambda c: bool(c.files) or c.num_clients is not None,
        "dataset=table needs dataset.files=[FILE, ...] (one file per client, or one file), or, in a "
        "deployment whose SuperNodes name their own file (node config data-path), dataset.num_clients=M",
    ),
    Field("targets", optional(names), "must be a list of names"),
    Field("features", optional(names), "must be a list of names"),
    Field("partition", one_of(_PARTITIONS), f"must be one of {_PARTITIONS}"),
    Field("missing", one_of(_MISSING), f"must be one of {_MISSING}"),
    Field("test_fraction", number(0, 1, high_open=True), "must be a number in [0, 1)"),
    Together(
        lambda c: not (c.test_fraction and c.test_column is not None),
        "set dataset.test_column or dataset.test_fraction, not both",
    ),
    Field("n_train", optional(integer(1)), "must be null (every row) or an integer >= 1"),
    Field("preset_n_train", lambda v: v is None, "is not an option (it must stay null; set dataset.n_train)"),
    Field("source", one_of(("auto", "files")), "must be auto or files (dataset=table reads files only)"),
    Field("num_clients", optional(integer(1)), "must be a positive integer"),
)
#: The rules of one file per SuperNode (``dataset.files=[]``: each node's ``data-path``).
_NODE_FILE_RULES = (
    Together(
        lambda c: c.partition == "natural" and c.site_column is None,
        "dataset.files=[] (each SuperNode's data-path) is one client per file: no site_column, eigen",
    ),
    Field("num_clients", integer(1), "must be a positive integer"),
    Together(
        lambda c: c.n_train is None,
        "dataset.n_train subsamples the pooled rows; with data-path files leave it null",
    ),
)
#: The rules of files named in the config.
_FILE_RULES = (
    Field(
        "files",
        lambda fs: all(Path(f).suffix.lower() in SUFFIXES for f in fs),
        f"must be files of the types {', '.join(SUFFIXES)} (by suffix)",
    ),
    Together(
        lambda c: len({Path(f).suffix.lower() == ".npz" for f in c.files}) == 1,
        "dataset.files mixes .npz files with tables (CSV/Parquet); use one kind",
    ),
    Together(
        lambda c: Path(c.files[0]).suffix.lower() == ".npz" or bool(c.targets),
        "{files[0]}: dataset.targets=[COLUMN, ...] is required for CSV and Parquet files",
    ),
    Together(
        lambda c: c.partition != "eigen" or (len(c.files) == 1 and c.site_column is None),
        "dataset.partition=eigen splits one file: give one file and no dataset.site_column",
    ),
    Together(
        lambda c: c.partition != "eigen" or c.num_clients is not None,
        "dataset.partition=eigen needs dataset.num_clients=K",
    ),
    Together(
        lambda c: c.partition == "eigen" or c.site_column is None or len(c.files) == 1,
        "dataset.site_column={site_column} splits one file, got dataset.files={files} "
        "(several files are already one client each)",
    ),
    Together(
        lambda c: c.partition == "eigen" or c.site_column is not None or len(c.files) > 1,
        "{files[0]}: one file is one client; give one file per client, or "
        "dataset.site_column=NAME, or dataset.partition=eigen dataset.num_clients=K",
    ),
    Together(
        lambda c: c.partition == "eigen" or c.site_column is not None or c.num_clients in (None, len(c.files)),
        "dataset.num_clients={num_clients} but dataset.files={files} give one client per file; leave it unset",
    ),
)


@dataclass(frozen=True)
class TableConfig(DatasetConfig):
    """Options of ``dataset=table`` (see the module docstring).

    Attributes
    ----------
    files : list of str
        One file per client (natural partition), or one file split by ``site_column`` or by the
        eigen partition. Relative paths are taken from the working directory.
    targets : list of str
        Target columns (required for CSV/Parquet; for ``.npz`` names of ``y``'s columns).
    features : list of str or None
        Input columns; None: every numeric column that is not a target, the site or the test column.
    site_column : str or None
        One file: one client per distinct value of this column (sorted).
    partition : str
        ``natural`` (per file or per site value) or ``eigen`` (needs ``num_clients``).
    test_column : str or None
        Rows where this column is truthy (non-zero, ``true``/``yes``) are held out for testing.
    test_fraction : float
        Hold out this fraction of every site's rows (chosen by ``seed``); 0: no test split.
    missing : str
        ``refuse`` (NaN/Inf in a used column is an error) or ``drop`` (drop those rows, logged).
    standardize_targets : str
        ``pooled`` (the pooled training mean and std, from the exchanged moments in a federation)
        or ``none`` (the stored units).
    standardize_inputs : str
        Tabular inputs: ``pooled`` (pooled training mean and std), ``site`` (each client its own)
        or ``none``.
    n_train : int or None
        None keeps every training row; an integer keeps that many, chosen by ``seed``.
    num_clients : int or None
        Derived from the files or the site column; required for ``partition=eigen``.
    preset_n_train : None
        What an experiment preset's data size resolves to for this data set
        (``conf/experiment/quickstart.yaml`` reads it with ``oc.select``): always null, so that a
        preset never resizes a user's own rows. Not an option.
    """

    name: str = "table"
    files: tuple[str, ...] = ()
    targets: tuple[str, ...] | None = None
    features: tuple[str, ...] | None = None
    site_column: str | None = None
    partition: str = "natural"
    test_column: str | None = None
    test_fraction: float = 0.0
    missing: str = "refuse"
    standardize_targets: str = "pooled"
    standardize_inputs: str = "pooled"
    n_train: int | None = None
    n_test: int = 0
    num_clients: int | None = None
    preset_n_train: None = None
    #: sizes and modification times of the files (set by [`preflight`][fedhead.data.table_config.TableConfig.preflight];
    # part of the repr, so a
    #: changed file is another data set for the process caches)
    fingerprint: str = field(default="", init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.files is None or isinstance(self.files, (str, bytes)):
            raise TableError(f"dataset.files must be a list of files, got {self.files!r}")
        object.__setattr__(self, "files", tuple(str(f) for f in self.files))
        for key in ("targets", "features"):  # Hydra passes lists
            value = getattr(self, key)
            if value is not None and not isinstance(value, (str, bytes)):
                object.__setattr__(self, key, tuple(value))
        check(self, _RULES, prefix="dataset.", error=TableError)
        check(self, _FILE_RULES if self.files else _NODE_FILE_RULES, prefix="dataset.", error=TableError)
        if self.files and self.partition == "natural" and self.site_column is None:
            object.__setattr__(self, "num_clients", len(self.files))  # one client per file

    def preflight(self) -> TableConfig:
        """The config with its files checked (they exist, each once), their absolute paths, their
        fingerprint and the client count of a site column (the one file read): the data layer's
        check of the files, before anything starts. Returns ``self`` when already checked."""
        if not self.files or self.fingerprint:
            return self
        seen: dict[Path, str] = {}
        for f in self.files:
            p = Path(f).expanduser()
            if not p.is_file():
                raise TableError(f"{f}: no such file (dataset.files; relative paths start at {Path.cwd()})")
            real = p.resolve()
            if real in seen:
                raise TableError(f"{f}: the same file is given twice in dataset.files (also as {seen[real]})")
            seen[real] = f
        checked = dataclasses.replace(self, files=tuple(str(p) for p in seen), num_clients=self._client_count())
        stats = [p.stat() for p in seen]
        object.__setattr__(checked, "fingerprint", ";".join(f"{s.st_size}:{s.st_mtime_ns}" for s in stats))
        return checked

    def _client_count(self) -> int | None:
        if self.partition == "eigen":
            return self.num_clients
        if self.site_column is None:
            return len(self.files)
        n = len(site_values(read_file(self.files[0]), self.site_column, self.files[0]))
        if self.num_clients is not None and self.num_clients != n:
            raise TableError(f"dataset.num_clients={self.num_clients} but the files give {n} clients; leave it unset")
        return n

    def use_files(self) -> bool:
        return True

    def site_local(self) -> bool:
        """Whether each client reads only its own file (one file per client, every row) and the
        federation standardises from the exchanged moments ([`fedhead.data.site`][fedhead.data.site]); otherwise
        (one file split by site or eigen, ``n_train``) the pooled rows are loaded together."""
        return self.partition == "natural" and self.site_column is None and self.n_train is None
