"""Open a torch.export `.pt2` without running code from it.

`torch.export.load` unpickles parts of the archive: tensors saved with `use_pickle` (weights, constants), custom
and opaque objects, and the sample inputs, which it tries with `weights_only=True` and then, on failure, loads
again with `weights_only=False`, so a crafted file runs code when it is compiled. This module reads the archive
with `zipfile` first and hands torch an in-memory copy that holds nothing to unpickle:

* every payload entry of the weights / constants configs must be a raw tensor (`use_pickle: false`); a pickled
  tensor, a custom or opaque object is refused by name;
* the sample inputs (wide-compile does not need them) are replaced by an empty record, which torch reads as none;
* any member outside the PT2 layout (AOTInductor libraries, extra files, ...) and the older zip format (read
  through pickle) are refused.

    >>> torch.export.load(safe_archive("model.pt2"))   # doctest: +SKIP
"""

from __future__ import annotations

import io
import json
import posixpath
import re
import zipfile
import zlib

from ..errors import WideError

# Members of a PT2 archive (below its root folder) that hold no pickle; configs and models are JSON
_PLAIN = re.compile(r"(archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id|"
                    r"models/[^/]+\.json|data/(weights|constants)/[^/]+_config\.json)")
_PAYLOAD = re.compile(r"data/(weights|constants)/([^/]+)")
_SAMPLE_INPUTS = re.compile(r"data/sample_inputs/[^/]+\.pt")


def _payload_files(archive: zipfile.ZipFile, root: str, path: str) -> set[str]:
    """The raw payload files the weights / constants config at `root/path` names; WideError for a pickled one."""
    folder = posixpath.dirname(path)
    try:
        config = json.loads(archive.read(posixpath.join(root, path)))["config"]
    except (ValueError, KeyError, TypeError) as err:
        raise WideError(f"unreadable payload config {path} ({type(err).__name__})") from None
    files = set()
    for name, meta in config.items():
        path_name = str(meta.get("path_name", ""))
        if meta.get("use_pickle") or not path_name.startswith(("weight_", "tensor_")):
            raise WideError(f"holds a pickled payload ({name!r}: {path_name!r}), which would run code when loaded; "
                            "wide-compile reads only plain tensors (re-export the model without tensor subclasses or "
                            "custom objects)")
        files.add(posixpath.join(folder, path_name))
    return files


def safe_archive(path: str) -> io.BytesIO:
    """An in-memory copy of the `.pt2` at `path` that torch.export.load reads without unpickling anything (module
    docstring); WideError naming what it refuses."""
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise WideError(f"{path}: no such model file") from None
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        raise WideError(f"{path}: not a readable torch.export program ({err})") from None
    with archive:
        names = [n for n in archive.namelist() if not n.endswith("/")]
        roots = {n.split("/", 1)[0] for n in names}
        if len(roots) != 1 or not any(n.endswith("/archive_format") for n in names):
            raise WideError(f"{path}: not a torch.export PT2 archive (an older format is read through pickle, which "
                            "could run code; re-export it with this torch)")
        root = roots.pop()
        rel = {n: n[len(root) + 1:] for n in names}
        buffer = io.BytesIO()
        try:
            payloads = set().union(*(_payload_files(archive, root, r) for r in rel.values()
                                     if r.startswith("data/") and r.endswith("_config.json")))
            with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as out:
                for name, r in rel.items():
                    if _SAMPLE_INPUTS.fullmatch(r):
                        out.writestr(archive.getinfo(name), b"")  # read back as no sample inputs, never unpickled
                    elif _PLAIN.fullmatch(r) or (_PAYLOAD.fullmatch(r) and r in payloads):
                        out.writestr(archive.getinfo(name), archive.read(name))
                    else:
                        raise WideError(f"member {r!r} is not part of a plain torch.export program (only models, raw "
                                        "weights and constants are read; code or pickles are not)")
        except WideError as err:
            raise WideError(f"{path}: {err}") from None
        except (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError, NotImplementedError) as err:
            raise WideError(f"{path}: damaged archive ({type(err).__name__}: {err})") from None
    buffer.seek(0)
    return buffer
