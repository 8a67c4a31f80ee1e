"""The --hf exports kept between commands: the graph of a config's export depends on the config, the task, the train
mode, the LoRA rank and the versions of the code that made it, never on the dims a command binds, so the second
command on a config reads the file the first one wrote instead of exporting again (tens of seconds for a 70B
config, and torch, transformers and onnxscript are not even imported).

An entry is a folder, <cache>/<key>/, holding the ONNX file (weights as external data in a sparse file beside it:
no byte of weight data on disk) and entry.json (what the export made, the file's SHA-256 and the data file's
size). It is written in a temporary folder beside it and renamed into place, so a reader sees a whole entry or
none; an entry that does not read back whole (a torn copy, a hand edit) is made again, never an error. The cache
is a per-user folder ($ONNXMEM_HF_CACHE, else $XDG_CACHE_HOME/onnxmem/hf, else ~/.cache/onnxmem/hf), never the
config's folder; ONNXMEM_HF_CACHE=off (or 0, no, false) exports in a temporary folder each time, as does a cache
folder that cannot be written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

CACHE_ENV = "ONNXMEM_HF_CACHE"
DISABLED_VALUES = frozenset({"0", "off", "no", "false", "none"})
# Bumped when an entry's layout or what the export writes changes in a way the sources below do not show.
ENTRY_FORMAT = 1
ENTRY_FILE = "entry.json"
# The packages whose versions change what the export writes (peft only where LoRA adapters are added).
EXPORT_PACKAGES = ("torch", "transformers", "onnxscript", "onnx", "onnx-ir", "onnxmem")
LORA_PACKAGES = ("peft",)
# onnxmem's own sources that make the export: their text is part of the key (a change there, even without a new
# version number, is a new entry).
_ONNXMEM = Path(__file__).resolve().parents[1]
EXPORT_SOURCES = (_ONNXMEM / "hf.py", _ONNXMEM / "frontends" / "layers.py", _ONNXMEM / "frontends" / "hfcache.py",
                  _ONNXMEM / "frontends" / "decode.py", _ONNXMEM / "torch.py")


def cache_folder(environ: Mapping[str, str] | None = None) -> Path | None:
    """Give the folder the exports are kept in, or None where caching is off (ONNXMEM_HF_CACHE=off)."""
    env = os.environ if environ is None else environ
    chosen = env.get(CACHE_ENV, "").strip()
    if chosen.lower() in DISABLED_VALUES:
        return None
    if chosen:
        return Path(chosen).expanduser()
    base = env.get("XDG_CACHE_HOME", "").strip()
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"  # (XDG: a relative one is ignored)
    return root / "onnxmem" / "hf"


def _version(package: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def export_key(config: Mapping[str, Any], *, task: str | None, training: bool, lora: int | None,
               repeat_layers: bool = True) -> str:
    """Give the cache key of an export: a hash of the config's contents (its keys sorted), the options, the
    versions of the packages that export it and onnxmem's exporting sources."""
    packages = EXPORT_PACKAGES + (LORA_PACKAGES if lora is not None else ())
    sources = {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in EXPORT_SOURCES
               if path.is_file()}
    described = {"format": ENTRY_FORMAT, "config": config, "task": task, "training": training, "lora": lora,
                 "repeat_layers": repeat_layers, "versions": {p: _version(p) for p in packages},
                 "sources": sources}
    text = json.dumps(described, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_entry(folder: Path, key: str) -> tuple[Path, dict[str, Any]] | None:
    """Give the ONNX file of the entry `key` and what its export made (entry.json's `made`), or None where there is
    no entry or it does not read back whole (then it is made again)."""
    entry = folder / key
    try:
        recorded = json.loads((entry / ENTRY_FILE).read_text())
        model = entry / recorded["file"]
        data = entry / recorded["data_file"]
        if recorded["key"] != key or model.parent != entry or data.parent != entry or \
                os.path.getsize(data) != recorded["data_bytes"] or _file_hash(model) != recorded["sha256"] or \
                not isinstance(recorded["made"], dict):
            return None
        return model, recorded["made"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove_entry(folder: Path, key: str) -> None:
    """Remove the entry `key` (renamed aside first, so that no reader sees it half removed)."""
    entry = folder / key
    if not entry.exists():
        return
    stale = Path(tempfile.mkdtemp(prefix=f".{key}-stale-", dir=folder))
    os.replace(entry, stale / key)
    shutil.rmtree(stale, ignore_errors=True)


def write_entry(folder: Path, key: str, make: Callable[[Path], tuple[Path, dict[str, Any]]]) \
        -> tuple[Path, dict[str, Any]] | None:
    """Make the entry `key`: `make` writes the export in the folder it is given (the ONNX file, its .data beside it)
    and gives the file and what it made (JSON-able); the entry is written in a temporary folder and renamed into
    place. Give the entry's ONNX file and `made`, or None where the cache folder cannot be written (`make` not
    called, the caller exports elsewhere). An error of `make` is raised, nothing left behind."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=folder))
    except OSError:
        return None
    try:
        model, made = make(staging)
        try:
            return _place(folder, key, staging, model, made)
        except OSError:  # (a concurrent command's rename came first, a full disk: its entry, else none)
            return read_entry(folder, key)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _place(folder: Path, key: str, staging: Path, model: Path, made: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    data = model.parent / f"{model.name}.data"
    recorded = {"key": key, "file": model.name, "data_file": data.name, "data_bytes": os.path.getsize(data),
                "sha256": _file_hash(model), "made": made}
    (staging / ENTRY_FILE).write_text(json.dumps(recorded, indent=1))
    entry = folder / key
    if entry.exists():  # a corrupt entry (read_entry said so), or one a concurrent command just wrote
        found = read_entry(folder, key)
        if found is not None:
            return found
        remove_entry(folder, key)
    os.rename(staging, entry)
    return entry / model.name, made
