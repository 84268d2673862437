from __future__ import annotations

from vllm_fork.sources.pipconf import PYPI_SIMPLE, merge, parse_config_list

SAMPLE = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
global.cert='/etc/ssl/certs/other.crt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
download.trusted-host='mirror.example\\nother.example'
user.ignored='x'
"""


def test_parse_config_list_by_section() -> None:
    sections = parse_config_list(SAMPLE)
    assert sections["global"]["extra-index-url"] == (
        "file:///opt/pypi/simple file:///opt/pypi-more/simple"
    )
    assert sections[":env:"]["default-timeout"] == "180"
    assert sections["download"]["trusted-host"] == "mirror.example\nother.example"


def test_merge_precedence_and_lists() -> None:
    conf = merge(parse_config_list(SAMPLE), environ={})
    assert conf.index_url == PYPI_SIMPLE
    assert conf.extra_index_urls == ("file:///opt/pypi/simple", "file:///opt/pypi-more/simple")
    # :env: (PIP_CERT) beats the global file
    assert conf.cert == "/etc/ssl/certs/ca-certificates.crt"
    assert conf.trusted_hosts == ("mirror.example", "other.example")
    assert conf.timeout == 180.0
    assert conf.indexes[0] == PYPI_SIMPLE


def test_environment_overrides_files() -> None:
    env = {
        "PIP_INDEX_URL": "https://mirror.example/simple",
        "PIP_EXTRA_INDEX_URL": "https://a.example/simple  https://b.example/simple",
        "PIP_PROXY": "http://proxy.example:3128",
        "PIP_CLIENT_CERT": "/k.pem",
        "HOME": "/root",
    }
    conf = merge(parse_config_list(SAMPLE), environ=env)
    assert conf.index_url == "https://mirror.example/simple"
    assert conf.extra_index_urls == ("https://a.example/simple", "https://b.example/simple")
    assert conf.proxy == "http://proxy.example:3128"
    assert conf.client_cert == "/k.pem"
    assert conf.indexes == (
        "https://mirror.example/simple",
        "https://a.example/simple",
        "https://b.example/simple",
    )


def test_command_section_beats_global_and_no_index() -> None:
    text = "global.index-url='https://g.example/simple'\ndownload.index-url='https://d.example/s'\n"
    assert merge(parse_config_list(text), environ={}).index_url == "https://d.example/s"
    conf = merge(parse_config_list(text), environ={"PIP_NO_INDEX": "1"})
    assert conf.indexes == ()


def test_other_commands_sections_are_not_read() -> None:
    # pip download never reads [install]: neither does the tool, whatever the order.
    text = (
        "download.index-url='https://d.example/s'\n"
        "global.index-url='https://g.example/simple'\n"
        "install.index-url='https://i.example/s'\n"
        "install.trusted-host='i.example'\n"
        "wheel.proxy='http://w.example:1'\n"
    )
    conf = merge(parse_config_list(text), environ={})
    assert conf.index_url == "https://d.example/s"
    assert conf.trusted_hosts == () and conf.proxy is None
    only_install = "global.index-url='https://g.example/simple'\ninstall.index-url='https://i/s'\n"
    assert (
        merge(parse_config_list(only_install), environ={}).index_url == "https://g.example/simple"
    )


def test_garbage_lines_are_ignored() -> None:
    assert parse_config_list("no equals sign\n\nnodot='x'\n") == {}


def test_load_pip_config_runs_pip_and_reads_env(monkeypatch, tmp_path) -> None:
    from vllm_fork.sources.pipconf import load_pip_config

    conf_file = tmp_path / "pip.conf"
    conf_file.write_text("[global]\nextra-index-url = file:///nowhere/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf_file))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple/")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    conf = load_pip_config()
    assert conf.indexes == ("http://127.0.0.1:9/simple/", "file:///nowhere/simple")
