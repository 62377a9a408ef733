"""The cases of tests/integration/test_output.py that need no Spark, no training
and no worker process."""


from dist_dl.core.quiet import quiet_defaults, quiet_env


def test_quiet_defaults_never_override_the_users_choice():
    environ = {"TF_CPP_MIN_LOG_LEVEL": "0"}
    quiet_defaults(environ)
    assert environ == {"TF_CPP_MIN_LOG_LEVEL": "0", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    assert quiet_env(environ) == environ and quiet_env({"PATH": "/bin"}) == {}
