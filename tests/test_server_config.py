"""``shmq server --config FILE``: TOML keys are the server's own options, the command line
and the environment win, bad files are one line with exit 2; ``--print-config``."""

import json
import re

import click
import pytest
from click.testing import CliRunner

from shmq.cli.config import config_file_options
from tests.test_cli import shmq_cli


def _write(tmp_path, text, name="shmq.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _settings(printed: str) -> dict:
    """The ``key = value  # source`` lines of --print-config, as {key: (value, source)}."""
    out = {}
    for line in printed.splitlines():
        if line.startswith("#"):
            continue
        key, _, rest = line.partition(" = ")
        value, _, source = rest.partition("  # ")
        out[key] = (value, source)
    return out


def test_the_file_sets_options_and_the_server_uses_them(tmp_path, namespace, servers):
    config = _write(tmp_path, 'log-format = "json"\nno_persist = true\nnamespace = "not-this-one"\n')
    srv = servers(namespace, "--config", config)  # --namespace and --port on the command line win
    started = [json.loads(line) for line in srv.log if line.startswith("{")]
    persistence = next(e for e in started if e.get("event") == "persistence")
    assert persistence["data_dir"] is None  # no-persist from the file
    assert next(e for e in started if e.get("event") == "server_started")["namespace"] == namespace
    assert srv.alive()
    assert srv.stop() == 0


def test_precedence_command_line_then_environment_then_file_then_defaults(tmp_path):
    config = _write(tmp_path, 'port = 7001\nloop = "uvloop"\nmax-frame-bytes = "1MiB"\ndata-dir = "rel/dir"\n'
                              'token = "s3cret"\n')
    r = shmq_cli("server", "--config", config, "--port", "7002", "--print-config", env={"SHMQ_LOOP": "asyncio"})
    assert r.returncode == 0, r.stderr
    got = _settings(r.stdout)
    assert got["port"] == ("7002", "command line")
    assert got["loop"] == ('"asyncio"', "environment")
    assert got["max-frame-bytes"] == ("1048576", "config file")
    assert got["data-dir"] == (json.dumps(str(tmp_path / "rel" / "dir")), "config file")  # from the file's directory
    assert got["host"] == ('"127.0.0.1"', "")  # the default
    assert "s3cret" not in r.stdout and "# token: set, not shown  # config file" in r.stdout.splitlines()


def test_shmq_config_names_the_file_and_print_config_loads_back(tmp_path):
    config = _write(tmp_path, "max_connections = 12\nno-persist = true\nfsync = \"never\"\n")
    first = shmq_cli("server", "--print-config", env={"SHMQ_CONFIG": config})
    assert first.returncode == 0, first.stderr
    assert _settings(first.stdout)["max-connections"] == ("12", "config file")
    again = shmq_cli("server", "--config", _write(tmp_path, first.stdout, "printed.toml"), "--print-config")
    assert again.returncode == 0, again.stderr
    assert {k: v for k, (v, _src) in _settings(again.stdout).items()} == \
        {k: v for k, (v, _src) in _settings(first.stdout).items()}


@pytest.mark.parametrize("text, error", [
    ("prot = 7878\n", r"config file \S+: unknown key 'prot': did you mean 'port'\? \(the keys are the command's "
                      r"options: host, port, namespace\.\.\.\)"),
    ("max_conections = 1\n", r"config file \S+: unknown key 'max_conections': did you mean 'max_connections'\? "),
    ("kafka-prot = 9092\n", r"config file \S+: unknown key 'kafka-prot': did you mean 'kafka-port'\? "),
    ("zzz = 1\n", r"config file \S+: unknown key 'zzz' \(the keys are the command's options: "),
    ('port = "x"\n', r"config file \S+: key 'port': 'x' is not a valid integer range"),
    ("port = 70000\n", r"config file \S+: key 'port': 70000 is not in the range 0<=x<=65535"),
    ("no-persist = 1\n", r"config file \S+: key 'no-persist': takes true or false"),
    ("port = true\n", r"config file \S+: key 'port': true is for on/off options; this one takes a value"),
    ('max-frame-bytes = "12 parsecs"\n', r"config file \S+: key 'max-frame-bytes': "),
    ("port = [1, 2]\n", r"config file \S+: key 'port': takes one value, not a list"),
    ("[server]\nport = 1\n", r"config file \S+: unknown key 'server'"),
    ("port = 1\nport=2\n", r"config file \S+: not TOML: "),
    ("port = 1\n'port' = 2\n", r"config file \S+: not TOML: "),
    ("port = 1\nPORT = 2\n", r"config file \S+: unknown key 'PORT': did you mean 'port'\?"),
    ("max-prefetch = 1\nmax_prefetch = 2\n", r"config file \S+: key 'max_prefetch' given twice"),
])
def test_a_bad_file_is_one_line_naming_the_file_and_the_key_exit_2(tmp_path, namespace, text, error):
    r = shmq_cli("server", "--config", _write(tmp_path, text), "--port", "0", "--no-persist", "--namespace", namespace)
    assert (r.returncode, r.stdout) == (2, "")
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert re.match(r"shmq: error: " + error, r.stderr), r.stderr


def test_a_setting_from_the_file_is_checked_as_one_from_the_command_line(tmp_path, namespace):
    r = shmq_cli("server", "--config", _write(tmp_path, "kafka-auto-create-partitions = 3\n"), "--port", "0",
                 "--namespace", namespace, "--no-persist")
    assert r.returncode == 2
    assert r.stderr.startswith("shmq: error: the --kafka-* options need --kafka-port; try '"), r.stderr


def test_a_missing_file_is_one_line_exit_2(tmp_path):
    r = shmq_cli("server", "--config", str(tmp_path / "nope.toml"))
    assert r.returncode == 2
    assert r.stderr.startswith(f"shmq: error: config file {tmp_path / 'nope.toml'}: No such file or directory; "
                               f"try '") and len(r.stderr.splitlines()) == 1


def test_an_option_added_later_is_a_key_without_a_list(tmp_path):
    """What makes --tls-cert or --group keys of the file: the options are read from the command."""
    seen = {}

    @click.command()
    @config_file_options
    @click.option("--tls-cert", type=click.Path(dir_okay=False), default=None)
    @click.option("--group", default=None)
    @click.option("--verbose", is_flag=True)
    @click.option("--tag", multiple=True)
    def cmd(**kw):
        seen.update(kw)

    config = _write(tmp_path, 'tls-cert = "cert.pem"\ngroup = "workers"\nverbose = true\ntag = ["a", "b"]\n')
    r = CliRunner().invoke(cmd, ["--config", config, "--group", "ops"])
    assert r.exit_code == 0, r.output
    assert seen == {"tls_cert": str(tmp_path / "cert.pem"), "group": "ops", "verbose": True, "tag": ("a", "b")}
    r = CliRunner().invoke(cmd, ["--config", _write(tmp_path, 'tag = "a"\n', "bad.toml")])
    assert r.exit_code == 2 and "key 'tag': takes a list" in r.output
