"""storage.adapters.publish: an adapter under a serving prefix as <prefix>/<name>/ with its provenance,
whole or not at all, and every refusal before anything is written."""
import json

import pytest

from storage.adapters import ADAPTER_FILES, PROVENANCE, AdapterError, publish
from storage.store import S3Store
from tests.helpers import make_adapter


@pytest.fixture(scope="module")
def adapter(tiny_model_dir, tmp_path_factory):
    export = tmp_path_factory.mktemp("export") / "global_step_3"
    make_adapter(tiny_model_dir, export / "policy", seed=1)  # a run's export layout
    return export


def listing(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_folder_prefix_gets_the_adapter_files_and_provenance(adapter, tiny_model_dir, tmp_path):
    where = publish(str(adapter), str(tmp_path / "serve"), "stage1", {"base_model": tiny_model_dir, "step": 3})
    assert where == str(tmp_path / "serve" / "stage1")
    assert listing(tmp_path / "serve") == ["stage1", *sorted(f"stage1/{f}" for f in (*ADAPTER_FILES, PROVENANCE))]
    for f in ADAPTER_FILES:
        assert (tmp_path / "serve" / "stage1" / f).read_bytes() == (adapter / "policy" / f).read_bytes()
    provenance = json.loads((tmp_path / "serve" / "stage1" / PROVENANCE).read_text())
    assert provenance == {"name": "stage1", "base_model": tiny_model_dir, "step": 3}


def test_the_serve_app_finds_what_was_published(adapter, tiny_model_dir, tmp_path):
    from serving.adapters import AdapterSource
    publish(str(adapter), str(tmp_path / "serve"), "stage1", {"base_model": tiny_model_dir})
    base = tiny_model_dir.rstrip("/").rsplit("/", 1)[-1]
    source = AdapterSource(str(tmp_path / "serve"), str(tmp_path / "cache"), base, 64)
    assert source.names() == ["stage1"]
    folder, _ = source.fetch("stage1")
    assert (tmp_path / "cache" / "stage1" / "adapter_model.safetensors").read_bytes() == \
        (adapter / "policy" / "adapter_model.safetensors").read_bytes() and folder.endswith("stage1")


@pytest.mark.parametrize("name", ["../up", "a/b", "", ".", "..", "x" * 129, "stage1\n", "a b"])
def test_an_invalid_name_is_refused(adapter, tiny_model_dir, tmp_path, name):
    with pytest.raises(AdapterError, match="invalid adapter name"):
        publish(str(adapter), str(tmp_path / "serve"), name, {"base_model": tiny_model_dir})
    assert not (tmp_path / "serve").exists() or listing(tmp_path / "serve") == []


def test_a_name_is_replaced_only_with_force(adapter, tiny_model_dir, tmp_path):
    other = make_adapter(tiny_model_dir, tmp_path / "other", seed=2)
    publish(str(adapter), str(tmp_path / "serve"), "stage1", {"base_model": tiny_model_dir, "step": 3})
    with pytest.raises(AdapterError, match="exists already.*--force"):
        publish(other, str(tmp_path / "serve"), "stage1", {"base_model": tiny_model_dir, "step": 9})
    weights = tmp_path / "serve" / "stage1" / "adapter_model.safetensors"
    assert weights.read_bytes() == (adapter / "policy" / "adapter_model.safetensors").read_bytes()
    publish(other, str(tmp_path / "serve"), "stage1", {"base_model": tiny_model_dir, "step": 9}, force=True)
    assert weights.read_bytes() == (tmp_path / "other" / "adapter_model.safetensors").read_bytes()
    assert json.loads((tmp_path / "serve" / "stage1" / PROVENANCE).read_text())["step"] == 9
    assert listing(tmp_path / "serve") == ["stage1", *sorted(f"stage1/{f}" for f in (*ADAPTER_FILES, PROVENANCE))]


def test_another_base_is_refused_by_the_adapter_and_by_the_prefix(adapter, tiny_model_dir, tmp_path):
    with pytest.raises(AdapterError, match="trained on .* not 'elsewhere/other-base'"):
        publish(str(adapter), str(tmp_path / "serve"), "stage1", {"base_model": "elsewhere/other-base"})
    assert not (tmp_path / "serve").exists()
    (tmp_path / "serve" / "theirs").mkdir(parents=True)  # a prefix already serving adapters of another base
    (tmp_path / "serve" / "theirs" / PROVENANCE).write_text(json.dumps({"base_model": "org/another-model"}))
    with pytest.raises(AdapterError, match="serves adapters of 'org/another-model'"):
        publish(str(adapter), str(tmp_path / "serve"), "stage1", {"base_model": tiny_model_dir})
    assert listing(tmp_path / "serve") == ["theirs", f"theirs/{PROVENANCE}"]


def test_a_folder_without_an_adapter_is_refused(tiny_model_dir, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdapterError, match="holds no adapter_config.json"):
        publish(str(tmp_path / "empty"), str(tmp_path / "serve"), "stage1", {"base_model": tiny_model_dir})


def test_on_s3_the_config_readers_wait_for_is_written_last(adapter, tiny_model_dir, s3_server, monkeypatch):
    """S3 has no rename: each object appears whole, and adapter_config.json (every reader needs it)
    goes last, so a reader sees the adapter whole or not at all; with force it is removed first."""
    from settings.schema import S3Config
    s3_server.client().create_bucket(Bucket="pub")
    writes = []
    upload, delete = S3Store.upload_dir, S3Store.delete

    def recording_upload(self, local_dir, key, last=None):
        real = self.client.upload_file
        self.client.upload_file = lambda path, bucket, k: (writes.append(("put", k.rsplit("/", 1)[-1])), real(path, bucket, k))
        return upload(self, local_dir, key, last)

    monkeypatch.setattr(S3Store, "upload_dir", recording_upload)
    monkeypatch.setattr(S3Store, "delete", lambda self, key: (writes.append(("delete", key.rsplit("/", 1)[-1])),
                                                              delete(self, key)))
    cfg = S3Config(endpoint_url=s3_server.url)
    publish(str(adapter), "s3://pub/adapters", "stage1", {"base_model": tiny_model_dir}, s3_cfg=cfg)
    assert writes[-1] == ("put", "adapter_config.json") and len(writes) == 3
    writes.clear()
    publish(str(adapter), "s3://pub/adapters", "stage1", {"base_model": tiny_model_dir}, force=True, s3_cfg=cfg)
    assert writes[0] == ("delete", "adapter_config.json") and writes[-1] == ("put", "adapter_config.json")
    keys = {o["Key"] for o in s3_server.client().list_objects_v2(Bucket="pub", Prefix="adapters/")["Contents"]}
    assert keys == {f"adapters/stage1/{f}" for f in (*ADAPTER_FILES, PROVENANCE)}


def test_the_tool_publishes_nothing_with_a_placeholder_prefix_or_no_export(tmp_path):
    from tests.helpers import run_tool
    out = run_tool("publish", ["stage1", "--to", "s3://<bucket>/lora-adapters", f"trainer.run_dir={tmp_path}",
                               f"trainer.export_path={tmp_path}/exports"])
    assert out.returncode == 2 and "placeholder <bucket>" in out.stderr
    out = run_tool("publish", ["stage1", "--to", str(tmp_path / "serve"), f"trainer.run_dir={tmp_path}",
                               f"trainer.export_path={tmp_path}/exports", "--step", "final"])
    assert out.returncode == 2 and "holds no export" in out.stderr and not (tmp_path / "serve").exists()
