"""Tests for disque.core.config: parsing, CONFIG GET/SET/REWRITE, the shipped file."""

from __future__ import annotations

import io
import os
import pathlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from disque.core.config import (
    DIRECTIVES,
    GET_ORDER,
    REWRITE_MARKER,
    REWRITE_ORDER,
    Config,
    ConfigError,
    ConfigFileError,
    Read,
    ShowHelp,
    ShowVersion,
    compile_glob,
    config_get,
    config_set,
    format_memory,
    parse_config_text,
    parse_memory,
    quote_arg,
    rewrite_config_text,
    split_args,
    split_args_bytes,
)
from disque.shell.config_file import build_config, read_config, rewrite_config_file, write_config_file

ROOT = pathlib.Path(__file__).resolve().parents[2]


def parsed(text: str, cwd: str = "/srv", read: Read | None = None) -> Config:
    config = Config(cwd=cwd)
    parse_config_text(text, config, read=read)
    return config


def changed_attrs(config: Config) -> dict[str, object]:
    """Attributes that differ from a fresh Config with the same dir (not
    `settings`, a copy of some of them)."""
    fresh = Config(cwd=config.dir)
    return {a: getattr(config, a) for a in Config.__slots__ if a != "settings" and getattr(config, a) != getattr(fresh, a)}


# --------------------------------------------------------------------------
# Defaults and the shipped file


def test_defaults():
    config = Config(cwd="/srv")
    assert config.dir == "/srv"
    assert config.config_file is None
    assert config.renamed_commands == {}
    assert (config.port, config.tcp_backlog, config.bind, config.unixsocket) == (7711, 511, [], None)
    assert (config.maxmemory, config.maxmemory_policy, config.maxmemory_samples) == (1 << 30, "acks", 5)
    assert (config.appendonly, config.appendfilename, config.appendfsync) == (False, "disque.aof", "everysec")
    assert config.auto_aof_rewrite_min_size == 64 << 20
    assert config.cluster_node_timeout == 15000
    assert config.client_output_buffer_limit == (0, 0, 0)
    assert (config.loglevel, config.logfile, config.pidfile) == ("notice", "", "/var/run/disque.pid")
    assert (config.hz, config.requirepass, config.aof_enqueue_jobs_once) == (10, None, False)
    assert (config.protected_mode, config.tls_port, config.tls_auth_clients) == (True, 0, "yes")
    assert config.cluster_secret is None and config.tls_cluster is False


def test_default_list_attribute_is_not_shared():
    first, second = Config(cwd="/"), Config(cwd="/")
    first.bind.append("127.0.0.1")
    assert second.bind == []


def test_config_has_no_stray_attributes():
    with pytest.raises(AttributeError):
        Config(cwd="/").maxmemroy = 1  # type: ignore[attr-defined]


def test_orders_name_known_directives():
    assert set(GET_ORDER) <= set(DIRECTIVES) and set(REWRITE_ORDER) <= set(DIRECTIVES)
    assert len(set(GET_ORDER)) == len(GET_ORDER) and len(set(REWRITE_ORDER)) == len(REWRITE_ORDER)


def test_shipped_config_is_all_defaults(tmp_path):
    text = (ROOT / "conf" / "disque.conf").read_text()
    config = parsed(text, cwd=str(tmp_path))
    assert changed_attrs(config) == {}


def test_shipped_config_sets_exactly_the_documented_directives():
    lines = (ROOT / "conf" / "disque.conf").read_text().splitlines()
    directives = [line for line in lines if line and not line.startswith("#")]
    assert directives == [
        "daemonize no",
        "pidfile /var/run/disque.pid",
        "port 7711",
        "tcp-backlog 511",
        "timeout 0",
        "tcp-keepalive 0",
        "loglevel notice",
        'logfile ""',
        "dir ./",
        "appendonly no",
        'appendfilename "disque.aof"',
        "appendfsync everysec",
        "auto-aof-rewrite-percentage 100",
        "auto-aof-rewrite-min-size 64mb",
        "aof-load-truncated yes",
        "aof-enqueue-jobs-once no",
        "slowlog-log-slower-than 10000",
        "slowlog-max-len 128",
        "latency-monitor-threshold 0",
        "client-output-buffer-limit normal 0 0 0",
        "hz 10",
        "aof-rewrite-incremental-fsync yes",
    ]
    for commented in ("# maxmemory 1gb", "# maxmemory-policy acks", "# cluster-node-timeout 15000"):
        assert commented in lines


def test_embedded_default_config_is_the_shipped_one():
    assert (ROOT / "disque" / "default.conf").read_bytes() == (ROOT / "conf" / "disque.conf").read_bytes()


# --------------------------------------------------------------------------
# Tokenizer


@pytest.mark.parametrize(
    ("line", "args"),
    [
        ("", []),
        ("   \t ", []),
        ("port 7711", ["port", "7711"]),
        ("  a   b\tc  ", ["a", "b", "c"]),
        ('logfile ""', ["logfile", ""]),
        ('"a b" c', ["a b", "c"]),
        ('"\\n\\r\\t\\b\\a\\\\\\"\\q"', ["\n\r\t\b\a\\\"q"]),
        ('"\\x41\\x4a\\x6b"', ["AJk"]),
        ('"\\x4"', ["x4"]),  # not two hex digits: a plain escaped "x"
        ('"\\xzz"', ["xzz"]),
        ('"\\xc3\\xa9"', ["\u00e9"]),
        ("'it\\'s' 'a\\nb'", ["it's", "a\\nb"]),
        ("foo\"bar baz\" x", ["foobar baz", "x"]),
        ("'a'\t\"b\"", ["a", "b"]),
        ('"a"\v', ["a"]),
        ("a\vb", ["a\vb"]),
    ],
)
def test_split_args(line, args):
    assert split_args(line) == args


@pytest.mark.parametrize("line", ['"abc', "'abc", '"a"b', "'a'b", '"abc\\"', "'abc\\'", 'x "'])
def test_split_args_unbalanced(line):
    with pytest.raises(ValueError):
        split_args(line)


def test_split_args_bytes_stops_at_nul_and_keeps_raw_bytes():
    assert split_args_bytes(b"a \xff\xfe\0 b") == [b"a", b"\xff\xfe"]
    assert split_args_bytes(b'"\\x00\\xff"') == [b"\x00\xff"]
    assert split_args("x \udcff") == ["x", "\udcff"]


@given(st.binary())
def test_split_args_bytes_only_raises_value_error(data):
    try:
        split_args_bytes(data)
    except ValueError:
        pass


@given(st.text(st.characters(codec="utf-8", exclude_characters="\0")))  # a NUL would end the line
def test_quote_arg_round_trips(text):
    assert split_args(quote_arg(text)) == [text]


def test_quote_arg_escapes():
    assert quote_arg('a"b\\c\n\x01\u00e9') == '"a\\"b\\\\c\\n\\x01\\xc3\\xa9"'


# --------------------------------------------------------------------------
# Config file parsing


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("nosuchdirective 1", "Bad directive or wrong number of arguments"),
        ("port", "Bad directive or wrong number of arguments"),
        ("port 1 2", "Bad directive or wrong number of arguments"),
        ("bind", "Bad directive or wrong number of arguments"),
        ("watchdog-period 10", "Bad directive or wrong number of arguments"),
        ("client-output-buffer-limit normal 0 0", "Bad directive or wrong number of arguments"),
        ("rename-command get", "Bad directive or wrong number of arguments"),
        ("include", "Bad directive or wrong number of arguments"),
        ('port "7711', "Unbalanced quotes in configuration line"),
        ("port 65536", "Invalid port"),
        ("port -1", "Invalid port"),
        ("bind " + " ".join(f"10.0.0.{i}" for i in range(17)), "Too many bind addresses specified"),
        ("unixsocketperm 1000", "Invalid socket file permissions"),
        ("unixsocketperm -1", "Invalid socket file permissions"),
        ("tcp-backlog -1", "Invalid backlog value"),
        ("timeout -1", "Invalid timeout value"),
        ("tcp-keepalive -5", "Invalid tcp-keepalive value"),
        ("loglevel loud", "Invalid log level. Must be one of debug, verbose, notice, warning"),
        ("syslog-enabled maybe", "argument must be 'yes' or 'no'"),
        ("syslog-facility local8", "Invalid log facility. Must be one of USER or between LOCAL0-LOCAL7"),
        ("databases 0", "Invalid number of databases"),
        ("maxclients 0", "Invalid max clients limit"),
        ("maxmemory 0", "You need to specify a memory limit greater than zero"),
        ("maxmemory -1gb", "You need to specify a memory limit greater than zero"),
        ("maxmemory-policy allkeys-lru", "Invalid maxmemory policy"),
        ("maxmemory-samples 0", "maxmemory-samples must be 1 or greater"),
        ("activerehashing 1", "argument must be 'yes' or 'no'"),
        ("daemonize true", "argument must be 'yes' or 'no'"),
        ("appendonly on", "argument must be 'yes' or 'no'"),
        ("appendfilename dir/disque.aof", "appendfilename can't be a path, just a filename"),
        ("appendfilename dir\\disque.aof", "appendfilename can't be a path, just a filename"),
        ("appendfsync sometimes", "argument must be 'no', 'always' or 'everysec'"),
        ("no-appendfsync-on-rewrite x", "argument must be 'yes' or 'no'"),
        ("auto-aof-rewrite-percentage -1", "Invalid negative percentage for AOF auto rewrite"),
        ("aof-rewrite-incremental-fsync x", "argument must be 'yes' or 'no'"),
        ("aof-load-truncated x", "argument must be 'yes' or 'no'"),
        ("aof-enqueue-jobs-once x", "argument must be 'yes' or 'no'"),
        ("requirepass " + "x" * 513, "Password is longer than CONFIG_AUTHPASS_MAX_LEN"),
        ("cluster-node-timeout 0", "cluster node timeout must be 1 or greater"),
        ("latency-monitor-threshold -1", "The latency threshold can't be negative"),
        ("client-output-buffer-limit slave 0 0 0", "Unrecognized client limit class"),
        ("client-output-buffer-limit normal 0 0 -1", "Negative number of seconds in soft limit is invalid"),
        ("protected-mode x", "argument must be 'yes' or 'no'"),
        ("tls-port 70000", "Invalid tls-port"),
        ("tls-auth-clients sometimes", "argument must be 'yes', 'no' or 'optional'"),
        ("tls-cluster x", "argument must be 'yes' or 'no'"),
    ],
)
def test_fatal_errors(line, message):
    text = f"# comment\n\nport 7711\n  {line}  \nport 7712\n"
    with pytest.raises(ConfigFileError) as info:
        parsed(text)
    assert info.value.message == message
    assert (info.value.line_no, info.value.line) == (4, line)


def test_unknown_directive_names_the_one_meant():
    with pytest.raises(ConfigFileError) as info:
        parsed("port 7711\nprot 7712\n")
    assert (info.value.message, info.value.hint) == ("Bad directive or wrong number of arguments", "port")
    assert str(info.value).endswith(">>> 'prot 7712'\nBad directive or wrong number of arguments\nDid you mean 'port'?")
    with pytest.raises(ConfigFileError) as info:
        parsed("zzzzzz 1\n")
    assert info.value.hint is None and str(info.value).endswith("Bad directive or wrong number of arguments")


def test_fatal_error_block():
    with pytest.raises(ConfigFileError) as info:
        parsed("\r\n\tloglevel  loud \r")
    assert str(info.value) == (
        "\n*** FATAL CONFIG FILE ERROR ***\n"
        "Reading the configuration file, at line 2\n"
        ">>> 'loglevel  loud'\n"
        "Invalid log level. Must be one of debug, verbose, notice, warning"
    )
    assert isinstance(info.value, ConfigError)


def test_values_and_names_are_case_insensitive():
    config = parsed(
        "PORT 1\nAppendOnly YES\nloglevel WARNING\nmaxmemory-policy NoEviction\n"
        "syslog-facility LOCAL3\nclient-output-buffer-limit NORMAL 1mb 2KB 3\nappendfsync Always"
    )
    assert changed_attrs(config) == {
        "port": 1,
        "appendonly": True,
        "loglevel": "warning",
        "maxmemory_policy": "noeviction",
        "syslog_facility": "local3",
        "client_output_buffer_limit": (1 << 20, 2048, 3),
        "appendfsync": "always",
    }


def test_later_lines_win_and_comments_are_whole_lines_only():
    config = parsed("port 1\n#port 2\n  # port 3\nport 4\n")
    assert config.port == 4
    with pytest.raises(ConfigFileError):
        parsed("port 1 # trailing comment")


def test_numbers_are_parsed_like_atoi():
    config = parsed("port abc\ntimeout 12abc\ntcp-backlog +7\nmaxclients '  9'\nunixsocketperm 755x")
    assert (config.port, config.timeout, config.tcp_backlog, config.maxclients) == (0, 12, 7, 9)
    assert config.unixsocketperm == 0o755


def test_hz_is_clamped_in_files():
    assert parsed("hz 0").hz == 1
    assert parsed("hz -3").hz == 1
    assert parsed("hz 100000").hz == 500
    assert parsed("hz 42").hz == 42


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", 1),
        ("1b", 1),
        ("1k", 1000),
        ("1KB", 1024),
        ("2m", 2_000_000),
        ("2mb", 2 << 20),
        ("3G", 3_000_000_000),
        ("3gB", 3 << 30),
        ("0", 0),
        ("-2kb", -2048),
    ],
)
def test_parse_memory(text, value):
    assert parse_memory(text) == value
    assert parse_memory(text, strict=False) == value


@pytest.mark.parametrize(
    ("text", "lenient"), [("5xb", 5), ("abc", 0), ("", 0), ("-", 0), (" 5", 0), ("5 kb", 5)]
)
def test_parse_memory_bad_units(text, lenient):
    assert parse_memory(text, strict=False) == lenient
    with pytest.raises(ValueError):
        parse_memory(text)


def test_unknown_memory_unit_in_file_is_bytes():
    assert parsed("maxmemory 100xyz").maxmemory == 100


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0"), (1, "1"), (1023, "1023"), (1024, "1kb"), (1536, "1536"), (1 << 20, "1mb"), (3 << 30, "3gb")],
)
def test_format_memory(n, text):
    assert format_memory(n) == text


def test_string_and_list_directives():
    config = parsed(
        'bind 127.0.0.1 "::1"\nunixsocket /tmp/d.sock\nunixsocketperm 700\nlogfile "a b.log"\n'
        "requirepass s3cret\npidfile /run/d.pid\nsyslog-ident dq\ncluster-config-file n.conf\n"
        'tls-cert-file /c.pem\ncluster-secret "x y"\ntls-auth-clients optional\ndatabases 3'
    )
    assert changed_attrs(config) == {
        "bind": ["127.0.0.1", "::1"],
        "unixsocket": "/tmp/d.sock",
        "unixsocketperm": 0o700,
        "logfile": "a b.log",
        "requirepass": "s3cret",
        "pidfile": "/run/d.pid",
        "syslog_ident": "dq",
        "cluster_config_file": "n.conf",
        "tls_cert_file": "/c.pem",
        "cluster_secret": "x y",
        "tls_auth_clients": "optional",
        "databases": 3,
    }


def test_empty_optional_string_unsets():
    assert parsed('requirepass foo\nrequirepass ""').requirepass is None
    assert parsed('logfile ""').logfile == ""


def test_dir_is_recorded_not_entered():
    cwd = os.getcwd()
    config = parsed("dir data\ndir ../logs/./x\n", cwd="/srv")
    assert config.dir == "/srv/logs/x"
    assert parsed("dir /abs/path/").dir == "/abs/path"
    assert parsed("dir ./").dir == "/srv"
    assert os.getcwd() == cwd


def test_rename_command_is_stored():
    config = parsed('rename-command CONFIG cfg\nrename-command DEBUG ""')
    assert config.renamed_commands == {"config": "cfg", "debug": ""}


def test_queue_lines_set_kestrel_options_and_survive_a_rewrite():
    text = "queue-defaults max_items 10 max_age 5000\nqueue jobs max_size 100 discard_old_when_full yes\nport 7712\n"
    config = parsed(text)
    jobs = config.queue_config.settings(b"jobs")
    assert (jobs.max_items, jobs.max_size, jobs.discard_old_when_full, jobs.max_age) == (10, 100, True, 5000)
    assert config.queue_config.settings(b"jobs+child") == jobs and config.queue_config.settings(b"other").max_size > 100
    assert config.queue_config == parsed(text).queue_config != Config().queue_config
    assert (config.queue_config == "x") is False
    assert "queue jobs max_size 100 discard_old_when_full yes" in rewrite_config_text(text, config)
    with pytest.raises(ConfigFileError, match="unknown queue option 'colour'"):
        parsed("queue jobs colour blue")
    with pytest.raises(ConfigFileError, match="Bad directive or wrong number of arguments"):
        parsed("queue jobs max_items")


def test_check_hook_makes_lines_fatal():
    seen = []

    def check(config, name, args):
        seen.append((name, args))
        if name == "rename-command" and args[0].lower() == "nosuch":
            raise ValueError("No such command in rename-command")

    config = Config(cwd="/srv")
    with pytest.raises(ConfigFileError) as info:
        parse_config_text("PORT 1\nrename-command nosuch x", config, check=check)
    assert info.value.message == "No such command in rename-command"
    assert info.value.line_no == 2
    assert seen == [("port", ["1"]), ("rename-command", ["nosuch", "x"])]
    assert config.renamed_commands == {}


def test_include(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "extra.conf").write_text("port 2\nhz 20\n")
    config = parsed("port 1\ndir sub\ninclude extra.conf\nhz 30", cwd=str(tmp_path), read=read_config)
    assert (config.port, config.hz) == (2, 30)


def test_include_needs_the_shells_reader():
    """The pure parser opens no file: without a reader an include is unreadable."""
    with pytest.raises(ConfigError) as info:
        parsed("include extra.conf")
    assert str(info.value) == "Fatal error, can't open config file 'extra.conf'"


def test_include_errors(tmp_path):
    with pytest.raises(ConfigError) as info:
        parsed("include missing.conf", cwd=str(tmp_path), read=read_config)
    assert not isinstance(info.value, ConfigFileError)
    assert str(info.value) == "Fatal error, can't open config file 'missing.conf'"

    (tmp_path / "bad.conf").write_text("\n\nhz 1\nport -5\n")
    with pytest.raises(ConfigFileError) as info:
        parsed("\ninclude bad.conf", cwd=str(tmp_path), read=read_config)
    assert (info.value.line_no, info.value.line, info.value.message) == (4, "port -5", "Invalid port")


# --------------------------------------------------------------------------
# Command line


def test_build_config_file_then_options(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.conf").write_text("port 1\nloglevel debug\nbind 10.0.0.1\n")
    config = build_config(["d.conf", "--port", "2", "--bind", "127.0.0.1", "::1", "--logfile", ""])
    assert config.config_file == str(tmp_path / "d.conf")
    assert (config.port, config.loglevel, config.logfile) == (2, "debug", "")
    assert config.bind == ["127.0.0.1", "::1"]


def test_build_config_without_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = build_config(["--port", "2", "--requirepass", 'a "b"\nc', "--appendonly", "yes"])
    assert config.config_file is None
    assert (config.port, config.requirepass, config.appendonly) == (2, 'a "b"\nc', True)
    assert changed_attrs(build_config([])) == {}


def test_build_config_option_errors_count_lines_after_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.conf").write_text("port 1\n")
    with pytest.raises(ConfigFileError) as info:
        build_config(["d.conf", "--hz", "5", "--port", "99999"])
    assert (info.value.line_no, info.value.line) == (4, 'port "99999"')
    with pytest.raises(ConfigFileError) as info:
        build_config(["d.conf", "stray"])
    assert info.value.line == '"stray"'


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--prot", "8731"], "disque-server: unknown option --prot (did you mean --port?)"),
        (["--nosuchthing", "1"], "disque-server: unknown option --nosuchthing;"),
        (["--port", "99999"], 'disque-server: --port "99999": Invalid port;'),
        (["--port"], "disque-server: --port: Bad directive or wrong number of arguments;"),
    ],
)
def test_build_config_option_errors_name_the_option(tmp_path, monkeypatch, argv, said):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigFileError) as info:
        build_config(argv)
    assert info.value.option and str(info.value).startswith(said)
    assert "FATAL CONFIG FILE ERROR" not in str(info.value) and "disque-server --help" in str(info.value)


def test_build_config_from_stdin(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = build_config(["-", "--hz", "50"], stdin=io.StringIO("port 3\nhz 5\n"))
    assert (config.port, config.hz, config.config_file) == (3, 50, None)


def test_build_config_missing_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        build_config(["nope.conf"])
    assert info.value.message == "Fatal error, can't open config file 'nope.conf'"


@pytest.mark.parametrize(
    ("arg", "exc"), [("-v", ShowVersion), ("--version", ShowVersion), ("-h", ShowHelp), ("--help", ShowHelp)]
)
def test_build_config_version_and_help(arg, exc):
    with pytest.raises(exc):
        build_config([arg, "--port", "1"])


def test_build_config_checks_the_log_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    config = build_config(["--dir", "d", "--logfile", "log.txt"])
    assert (tmp_path / "d" / "log.txt").exists() and config.logfile == "log.txt"
    with pytest.raises(ConfigFileError) as info:
        build_config(["--logfile", "no/such/dir/log.txt"])
    assert info.value.message == "Can't open the log file: No such file or directory"


def test_build_config_passes_the_callers_check(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def check(config, name, args):
        if name == "rename-command":
            raise ValueError("Target command name already exists")

    with pytest.raises(ConfigFileError) as info:
        build_config(["--rename-command", "a", "b"], check=check)
    assert info.value.message == "Target command name already exists"


# --------------------------------------------------------------------------
# CONFIG GET


def test_config_get_all_in_upstream_order():
    config = Config(cwd="/srv")
    names = [name for name, _ in config_get(config, "*")]
    spec = (
        "requirepass unixsocket logfile pidfile maxmemory maxmemory-samples "
        "timeout auto-aof-rewrite-percentage auto-aof-rewrite-min-size "
        "slowlog-log-slower-than latency-monitor-threshold slowlog-max-len port "
        "tcp-backlog databases maxclients watchdog-period hz cluster-node-timeout "
        "tcp-keepalive no-appendfsync-on-rewrite daemonize activerehashing "
        "aof-rewrite-incremental-fsync aof-load-truncated aof-enqueue-jobs-once "
        "maxmemory-policy loglevel appendfsync syslog-facility appendonly dir "
        "client-output-buffer-limit unixsocketperm bind"
    ).split()
    assert names[: len(spec)] == spec
    assert names[len(spec) :] == (
        "cluster-secret-file protected-mode cluster-protected-mode tls-port tls-cert-file tls-key-file "
        "tls-ca-cert-file tls-auth-clients tls-cluster tls-protocols tls-ciphers metrics-port memcache-port memcache-tls-port "
        "memcache-value-key memcache-max-item-size memcache-auth read-behind job-memory-limit max-job-size read-behind-prefetch "
        "priority-aging zone min-zones schedule-grace schedule-catch-up result-ttl aof-load-damaged"
    ).split()
    hidden = {"appendfilename", "cluster-config-file", "syslog-enabled", "syslog-ident"}
    assert not (hidden | {"cluster-secret", "cluster-secret-previous"}) & set(names)


def test_config_get_value_formats():
    config = parsed(
        "maxmemory 2mb\nunixsocketperm 755\nbind 127.0.0.1 ::1\ntcp-keepalive 60\n"
        "client-output-buffer-limit normal 1kb 2 3\nappendonly yes\nloglevel DEBUG",
        cwd="/var/lib/disque",
    )
    values = dict(config_get(config, "*"))
    assert values["maxmemory"] == "2097152"
    assert values["unixsocketperm"] == "755"
    assert values["bind"] == "127.0.0.1 ::1"
    assert values["tcp-keepalive"] == "yes"
    assert values["client-output-buffer-limit"] == "normal 1024 2 3"
    assert values["appendonly"] == "yes"
    assert values["loglevel"] == "debug"
    assert values["dir"] == "/var/lib/disque"
    assert values["requirepass"] == "" and values["unixsocket"] == ""


@pytest.mark.parametrize(
    ("pattern", "names"),
    [
        ("maxmemory", ["maxmemory"]),
        ("MAXMEMORY", []),
        ("maxmemory*", ["maxmemory", "maxmemory-samples", "maxmemory-policy"]),
        ("*port", ["port", "tls-port", "metrics-port", "memcache-port", "memcache-tls-port"]),
        ("?ort", ["port"]),
        ("h[xyz]", ["hz"]),
        ("h[^a]", ["hz"]),
        ("h[a-z]", ["hz"]),
        ("h[z-a]", ["hz"]),
        ("h[^a-z]", []),
        ("h\\z", ["hz"]),
        ("h[z", ["hz"]),
        ("cluster-secret", []),
        ("nothing", []),
    ],
)
def test_config_get_patterns(pattern, names):
    assert [name for name, _ in config_get(Config(cwd="/"), pattern)] == names


@pytest.mark.parametrize(
    ("pattern", "text", "matches"),
    [
        ("a*b", "ab", True),
        ("a*b", "axxb", True),
        ("a**b", "ab", True),
        ("a?c", "abc", True),
        ("a?c", "ac", False),
        ("[]", "a", False),
        ("[^]", "a", True),
        ("\\*", "*", True),
        ("\\*", "a", False),
        ("a\\", "a\\", True),
        ("[\\]]", "]", True),
        ("[a-]", "_", True),  # as in Redis, the range runs from "a" to "]"
        ("a.b", "axb", False),
        ("(", "(", True),
    ],
)
def test_compile_glob(pattern, text, matches):
    assert bool(compile_glob(pattern).fullmatch(text)) is matches


# --------------------------------------------------------------------------
# CONFIG SET


@pytest.mark.parametrize(
    ("name", "value", "attr", "result"),
    [
        ("timeout", "30", "timeout", 30),
        ("tcp-keepalive", "yes", "tcp_keepalive", 1),
        ("TCP-KEEPALIVE", "Yes", "tcp_keepalive", 1),
        ("loglevel", "WARNING", "loglevel", "warning"),
        ("maxclients", "5", "maxclients", 5),
        ("maxmemory", "0", "maxmemory", 0),
        ("maxmemory", "100mb", "maxmemory", 100 << 20),
        ("maxmemory", "1k", "maxmemory", 1000),
        ("maxmemory-policy", "noeviction", "maxmemory_policy", "noeviction"),
        ("maxmemory-samples", "3", "maxmemory_samples", 3),
        ("activerehashing", "no", "activerehashing", False),
        ("hz", "0", "hz", 1),
        ("hz", "100", "hz", 100),
        ("hz", "9999", "hz", 500),
        ("appendonly", "yes", "appendonly", True),
        ("appendfsync", "always", "appendfsync", "always"),
        ("auto-aof-rewrite-percentage", "0", "auto_aof_rewrite_percentage", 0),
        ("auto-aof-rewrite-min-size", "1048576", "auto_aof_rewrite_min_size", 1 << 20),
        ("aof-rewrite-incremental-fsync", "no", "aof_rewrite_incremental_fsync", False),
        ("aof-load-truncated", "no", "aof_load_truncated", False),
        ("aof-enqueue-jobs-once", "yes", "aof_enqueue_jobs_once", True),
        ("requirepass", "pw", "requirepass", "pw"),
        ("cluster-node-timeout", "0", "cluster_node_timeout", 0),
        ("Cluster-Node-Timeout", "3000", "cluster_node_timeout", 3000),
        ("slowlog-log-slower-than", "0", "slowlog_log_slower_than", 0),
        ("slowlog-max-len", "10", "slowlog_max_len", 10),
        ("latency-monitor-threshold", "100", "latency_monitor_threshold", 100),
        ("client-output-buffer-limit", "normal 1mb 2kb 3", "client_output_buffer_limit", (1 << 20, 2048, 3)),
        ("client-output-buffer-limit", "normal 1 2 3 NORMAL 4 5 6", "client_output_buffer_limit", (4, 5, 6)),
        ("watchdog-period", "200", "watchdog_period", 200),
        ("dir", "sub/../data", "dir", "/srv/data"),
        ("dir", "/tmp", "dir", "/tmp"),
        ("cluster-secret", "s", "cluster_secret", "s"),
        ("cluster-secret-file", "/etc/secret", "cluster_secret_file", "/etc/secret"),
        ("cluster-secret-previous", "old", "cluster_secret_previous", "old"),
        ("protected-mode", "no", "protected_mode", False),
        ("tls-cert-file", "/c.pem", "tls_cert_file", "/c.pem"),
        ("tls-auth-clients", "optional", "tls_auth_clients", "optional"),
        ("tls-ciphers", "HIGH", "tls_ciphers", "HIGH"),
    ],
)
def test_config_set(name, value, attr, result):
    config = Config(cwd="/srv")
    assert config_set(config, name, value) == [attr]
    assert getattr(config, attr) == result


def test_config_set_unchanged_value_reports_nothing():
    config = Config(cwd="/srv")
    assert config_set(config, "loglevel", "NOTICE") == []
    assert config_set(config, "dir", ".") == []
    assert config_set(config, "hz", "10") == []
    assert config_set(config, "tcp-keepalive", "no") == []
    assert config_set(config, "client-output-buffer-limit", "") == []  # no groups: accepted, nothing set


def test_config_set_requirepass_empty_clears():
    config = Config(cwd="/srv")
    config_set(config, "requirepass", "pw")
    assert config_set(config, "requirepass", "") == ["requirepass"]
    assert config.requirepass is None
    assert dict(config_get(config, "requirepass")) == {"requirepass": ""}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("timeout", "-1"),
        ("timeout", "abc"),
        ("timeout", " 5"),
        ("timeout", "+5"),
        ("timeout", "05"),
        ("timeout", "1.5"),
        ("timeout", "99999999999999999999"),
        ("tcp-keepalive", "60"),
        ("loglevel", "loud"),
        ("maxclients", "0"),
        ("maxmemory", "-1"),
        ("maxmemory", "1xb"),
        ("maxmemory", "mb"),
        ("maxmemory-policy", "lru"),
        ("maxmemory-samples", "0"),
        ("activerehashing", "1"),
        ("hz", "-1"),
        ("appendonly", "maybe"),
        ("appendfsync", "sometimes"),
        ("auto-aof-rewrite-percentage", "-5"),
        ("auto-aof-rewrite-min-size", "64mb"),
        ("auto-aof-rewrite-min-size", "-1"),
        ("requirepass", "x" * 513),
        ("cluster-node-timeout", "-1"),
        ("slowlog-log-slower-than", "-1"),
        ("latency-monitor-threshold", "-1"),
        ("client-output-buffer-limit", "normal 1 2"),
        ("client-output-buffer-limit", "slave 1 2 3"),
        ("client-output-buffer-limit", "normal -1 2 3"),
        ("client-output-buffer-limit", "normal 1 2 -3"),
        ("client-output-buffer-limit", "normal 1 2 3 pubsub 1 2 3"),
        ("client-output-buffer-limit", "normal  1 2 3"),
        ("watchdog-period", "-1"),
        ("protected-mode", "1"),
        ("tls-auth-clients", "sometimes"),
    ],
)
def test_config_set_invalid(name, value):
    config = Config(cwd="/srv")
    with pytest.raises(ConfigError) as info:
        config_set(config, name, value)
    assert info.value.message == f"Invalid argument '{value}' for CONFIG SET '{name}'"
    assert changed_attrs(config) == {}


@pytest.mark.parametrize(
    "name",
    [
        "port",
        "bind",
        "unixsocket",
        "unixsocketperm",
        "tcp-backlog",
        "logfile",
        "syslog-enabled",
        "syslog-ident",
        "syslog-facility",
        "databases",
        "daemonize",
        "pidfile",
        "appendfilename",
        "no-appendfsync-on-rewrite",
        "cluster-config-file",
        "include",
        "rename-command",
        "tls-port",
        "tls-cluster",
        "nosuch",
    ],
)
def test_config_set_unsupported(name):
    with pytest.raises(ConfigError) as info:
        config_set(Config(cwd="/srv"), name, "1")
    assert info.value.message == f"Unsupported CONFIG parameter: {name}"


@pytest.mark.parametrize(
    ("name", "meant"),
    [("cluster_node_timeout", "cluster-node-timeout"), ("maxmemroy", "maxmemory"), ("LOGLEVL", "loglevel")],
)
def test_config_set_suggests_the_setting_meant(name, meant):
    with pytest.raises(ConfigError) as info:
        config_set(Config(cwd="/srv"), name, "1")
    assert info.value.message == f"Unsupported CONFIG parameter: {name} (did you mean '{meant}'?)"


def test_config_get_shows_keepalive_set_quirk():
    config = Config(cwd="/srv")
    config_set(config, "tcp-keepalive", "yes")
    assert config_get(config, "tcp-keepalive") == [("tcp-keepalive", "yes")]
    assert "tcp-keepalive 1\n" in rewrite_config_text("", config)


# --------------------------------------------------------------------------
# CONFIG REWRITE


def test_rewrite_verified_example(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cwd = os.getcwd()
    path = tmp_path / "disque.conf"
    path.write_text(f'# test config\nport 7714\nbind 127.0.0.1\nappendonly yes\nlogfile "{cwd}/log.txt"\n')
    config = build_config([str(path), "--loglevel", "verbose", "--cluster-node-timeout", "3000"])
    assert config_set(config, "aof-enqueue-jobs-once", "yes") == ["aof_enqueue_jobs_once"]
    rewrite_config_file(config)
    assert path.read_text() == (
        "# test config\n"
        "port 7714\n"
        "bind 127.0.0.1\n"
        "appendonly yes\n"
        f'logfile "{cwd}/log.txt"\n'
        "# Generated by CONFIG REWRITE\n"
        "loglevel verbose\n"
        f'dir "{cwd}"\n'
        "cluster-node-timeout 3000\n"
        "aof-enqueue-jobs-once yes\n"
    )
    # The rewritten file gives back the same configuration, and rewriting
    # again changes nothing.
    again = build_config([str(path)])
    assert changed_attrs(again) == changed_attrs(config)
    rewrite_config_file(again)
    assert path.read_text().count(REWRITE_MARKER) == 1
    assert "aof-enqueue-jobs-once yes" in path.read_text()


def test_rewrite_of_defaults_only_writes_dir():
    assert rewrite_config_text("", Config(cwd="/srv")) == f'{REWRITE_MARKER}\ndir "/srv"\n'


def test_rewrite_replaces_first_occurrence_and_blanks_duplicates():
    old = "port 1\n\nhz 20\n\nPORT 2\n\n\n# keep\nport 3\ntimeout 0\n"
    config = parsed(old)
    config.timeout = 0
    assert rewrite_config_text(old, config) == (
        'port 3\n\nhz 20\n\n# keep\n\ntimeout 0\n{m}\ndir "/srv"\n'.format(m=REWRITE_MARKER)
    )


def test_rewrite_keeps_the_existing_marker_and_unhandled_lines():
    old = (
        "include /etc/other.conf\nrename-command FLUSHALL \"\"\ndatabases 4\n"
        f"unknown-thing 1\n{REWRITE_MARKER}\ndir \"/old\"\n"
    )
    config = Config(cwd="/srv")
    config.maxmemory = 2 << 30
    assert rewrite_config_text(old, config) == (
        'include /etc/other.conf\nrename-command FLUSHALL ""\ndatabases 4\n'
        f'unknown-thing 1\n{REWRITE_MARKER}\ndir "/srv"\nmaxmemory 2gb\n'
    )


def test_rewrite_drops_unset_strings_and_empty_bind():
    old = "requirepass secret\nunixsocket /tmp/s\nbind 1.2.3.4\ncluster-secret x\nport 7711\n"
    config = Config(cwd="/srv")
    assert rewrite_config_text(old, config) == f'\nport 7711\n{REWRITE_MARKER}\ndir "/srv"\n'


def test_rewrite_formats():
    config = parsed(
        'requirepass "p w"\nunixsocket /tmp/s\nunixsocketperm 700\nbind a b\nmaxmemory 1536\n'
        "auto-aof-rewrite-min-size 3mb\nclient-output-buffer-limit normal 1kb 2048 5\nlogfile l\n"
        "tls-port 6380\nprotected-mode no\ncluster-secret 'se\"c'\ntls-auth-clients optional\n"
        "appendfilename x.aof\nsyslog-ident dq\ncluster-config-file n.conf\n"
    )
    lines = rewrite_config_text("", config).splitlines()
    assert lines == [
        REWRITE_MARKER,
        "bind a b",
        'unixsocket "/tmp/s"',
        "unixsocketperm 700",
        'logfile "l"',
        'syslog-ident "dq"',
        'dir "/srv"',
        'requirepass "p w"',
        "maxmemory 1536",
        'appendfilename "x.aof"',
        "auto-aof-rewrite-min-size 3mb",
        'cluster-config-file "n.conf"',
        "client-output-buffer-limit normal 1kb 2kb 5",
        'cluster-secret "se\\"c"',
        "protected-mode no",
        "tls-port 6380",
        "tls-auth-clients optional",
    ]
    assert changed_attrs(parsed("\n".join(lines))) == changed_attrs(config)


def test_rewrite_of_the_shipped_file_keeps_it_and_adds_dir():
    old = (ROOT / "conf" / "disque.conf").read_text()
    new = rewrite_config_text(old, parsed(old))
    # Strings come back quoted, dir absolute; everything else stays as shipped.
    expected = old.replace("dir ./", 'dir "/srv"').replace("pidfile /var/", 'pidfile "/var/').replace(
        "disque.pid\n", 'disque.pid"\n'
    )
    assert new == expected


def test_rewrite_marks_unparsable_lines_and_trims():
    old = '   port 5   \n\t"unbalanced\nhz 10 "x"y\n   \n\n# c\n'
    assert rewrite_config_text(old, Config(cwd="/srv")) == (
        f'port 7711\n# ??? "unbalanced\n# ??? hz 10 "x"y\n\n# c\n{REWRITE_MARKER}\ndir "/srv"\n'
    )


def test_write_config_file_pads_then_truncates(tmp_path, monkeypatch):
    path = tmp_path / "c.conf"
    path.write_text("x" * 20)
    truncated = []
    monkeypatch.setattr(os, "ftruncate", lambda fd, size: truncated.append(size))
    write_config_file(str(path), "port 1\n")
    assert path.read_bytes() == b"port 1\n" + b"\n" + b"#" * 12
    monkeypatch.undo()
    write_config_file(str(path), "port 1\n")
    assert path.read_bytes() == b"port 1\n"
    assert truncated == [7]


def test_write_config_file_grows_and_creates(tmp_path):
    path = tmp_path / "new.conf"
    write_config_file(str(path), "hz 10\n")
    assert path.read_text() == "hz 10\n"
    write_config_file(str(path), "hz 10\nport 1\n")
    assert path.read_text() == "hz 10\nport 1\n"
    with pytest.raises(OSError):
        write_config_file(str(tmp_path / "missing" / "x.conf"), "")


def test_rewrite_config_file_errors(tmp_path):
    config = Config(cwd=str(tmp_path))
    with pytest.raises(ConfigError) as info:
        rewrite_config_file(config)
    assert info.value.message == "The server is running without a config file"
    config.config_file = str(tmp_path / "fresh.conf")
    rewrite_config_file(config)
    assert (tmp_path / "fresh.conf").read_text() == f'{REWRITE_MARKER}\ndir "{tmp_path}"\n'
    config.config_file = str(tmp_path)  # a directory
    with pytest.raises(OSError):
        rewrite_config_file(config)


def test_lines_of_form_feeds_and_missing_final_newline():
    assert changed_attrs(parsed("\v\f\nport 1")) == {"port": 1}
    rewritten = rewrite_config_text("\f\nport 1", Config(cwd="/srv"))
    assert rewritten == f'\f\nport 7711\n{REWRITE_MARKER}\ndir "/srv"\n'
