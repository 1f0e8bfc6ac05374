"""Tuned profiles on disk, one JSON file per (hardware, model, drafter, vLLM version)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..config.controller import ControllerSettings
from ..speculative import SpecConfig
from .estimator import Estimator

if TYPE_CHECKING:
    from .controller import Controller

log = logging.getLogger(__name__)

DEFAULT_PROFILE_DIR = Path("~/.cache/quickdraft/profiles")
PROFILE_SCHEMA = 1


@dataclass(frozen=True)
class ProfileKey:
    """What a tuned profile is valid for."""

    hardware: str
    """e.g. "NVIDIA H200 x1" or "AMD EPYC (2 cores)"."""
    model: str
    """Target model name or path (a local path with its weights' fingerprint)."""
    drafter: str
    """Drafter name or path (both heads, if the modes use different ones; local paths fingerprinted)."""
    vllm_version: str

    def __post_init__(self) -> None:
        for name in ("hardware", "model", "drafter", "vllm_version"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                raise ValueError(f"ProfileKey.{name} must be a non-empty string")

    def file_name(self) -> str:
        """Readable slug plus a hash of the exact key (slugs can collide)."""
        text = json.dumps(asdict(self), sort_keys=True)
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        slug = "__".join(_slug(v) for v in (self.hardware, self.model, self.drafter, self.vllm_version))
        return f"{slug[:120]}__{digest}.json"


FINGERPRINT_BYTES = 65536  # read from each end of every weight file


def weights_fingerprint(path: str) -> str | None:
    """A short fingerprint of a local model folder's weights, None for a hub name.

    A profile tuned for one set of weights is wrong for another at the same
    path (an upgrade that retrains the embedded model, a fine-tune saved over
    the old one): acceptance and step times change with the weights. Hashing
    whole files is too slow for a 60-GB model, so this hashes config.json and,
    per weight file, its size and its first and last 64 KiB, which differ
    between any two trainings.
    """
    root = Path(path)
    if not root.is_dir():
        return None
    h = hashlib.sha256()
    config = root / "config.json"
    if config.is_file():
        h.update(config.read_bytes())
    for f in sorted(root.glob("*.safetensors")) + sorted(root.glob("*.bin")):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with f.open("rb") as fh:
            h.update(fh.read(FINGERPRINT_BYTES))
            fh.seek(max(0, size - FINGERPRINT_BYTES))
            h.update(fh.read(FINGERPRINT_BYTES))
    return h.hexdigest()[:10]


def with_fingerprint(path: str) -> str:
    """``path``, plus its weights' fingerprint when it is a local folder."""
    fp = weights_fingerprint(path)
    return path if fp is None else f"{path} @{fp}"


def _slug(v: str) -> str:
    tail = v.rstrip("/").split("/")[-1] if "/" in v else v
    return re.sub(r"[^A-Za-z0-9.]+", "-", tail).strip("-")[:40] or "x"


class ProfileStore:
    """Reads and writes profiles; a missing, corrupt or foreign file is logged and ignored."""

    def __init__(self, directory: str | os.PathLike | None = None) -> None:
        self.directory = Path(directory if directory is not None else DEFAULT_PROFILE_DIR).expanduser()

    def path_for(self, key: ProfileKey) -> Path:
        return self.directory / key.file_name()

    def load(self, key: ProfileKey) -> dict | None:
        path = self.path_for(key)
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            log.info("no tuned profile at %s; starting from defaults", path)
            return None
        except (OSError, ValueError) as e:
            log.warning("ignoring unreadable profile %s: %s", path, e)
            return None
        if not isinstance(data, dict) or data.get("key") != asdict(key):
            log.warning("ignoring profile %s: it was written for %s", path,
                        data.get("key") if isinstance(data, dict) else "something else")
            return None
        return data

    def save(self, key: ProfileKey, profile: dict) -> Path:
        """Atomic write (temp file + rename), so a crash never leaves half a profile."""
        path = self.path_for(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = dict(profile)
        data["key"] = asdict(key)
        fd, tmp = tempfile.mkstemp(prefix=".profile-", suffix=".json", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.write("\n")
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return path


def encode(start: SpecConfig, estimator: Estimator, rebuild: dict, saved_at: float) -> dict:
    """A profile: the engine setting to start with, the models' data and the
    rebuild figures measured here."""
    return {
        "schema": PROFILE_SCHEMA,
        "saved_at": saved_at,
        "config": start.label(),
        "engine": start.to_dict(),
        "acceptance": estimator.acceptance.to_dict(),
        "step_model": estimator.step.to_dict(),
        "ttft": estimator.ttft.to_dict(),
        **rebuild,
    }


def decode(profile: dict, settings: ControllerSettings) -> tuple[SpecConfig, Estimator]:
    """The start setting and a fresh estimator loaded with the profile's data
    (raises KeyError, TypeError or ValueError if it is unusable)."""
    if not isinstance(profile, dict) or profile.get("schema") != PROFILE_SCHEMA:
        raise ValueError(f"profile schema {profile.get('schema') if isinstance(profile, dict) else None!r} "
                         f"is not {PROFILE_SCHEMA}")
    start = start_setting(profile)
    estimator = Estimator(settings)
    estimator.acceptance.load_dict(profile.get("acceptance", {}))
    estimator.step.load_dict(profile.get("step_model", {}))
    estimator.ttft.load_dict(profile.get("ttft", {}))
    return start, estimator


def start_setting(profile: dict) -> SpecConfig:
    """The profile's engine setting. Profiles written before the one config
    type kept a per-step ``config`` label and, with speculation on, a
    ``schedule`` dict of ``(min_batch, max_batch, K)`` ranges."""
    if profile.get("engine"):
        return SpecConfig.from_dict(profile["engine"])
    if profile.get("schedule"):
        return SpecConfig.from_dict(profile["schedule"])
    return SpecConfig.parse(profile["config"])


def load_into(controller: "Controller", store: ProfileStore, key: ProfileKey) -> bool:
    """Restore ``controller`` from the stored profile; False (logged) if there
    is none or it is unusable."""
    controller.profile_path = str(store.path_for(key))
    data = store.load(key)
    if data is None:
        return False
    try:
        controller.restore(data)
    except (KeyError, TypeError, ValueError) as e:
        log.warning("ignoring profile %s: %s", store.path_for(key), e)
        return False
    log.info("loaded tuned profile %s (start config %s)", store.path_for(key), data.get("config"))
    return True


def save_from(controller: "Controller", store: ProfileStore, key: ProfileKey) -> Path:
    path = store.save(key, controller.profile_dict())
    controller.profile_path = str(path)
    return path
