"""The host side's promises that need no namespace: the warning a sandbox without isolation gives."""

from tools.sandbox import Sandbox, SandboxLimits


def test_a_sandbox_without_isolation_warns_what_it_does_not_isolate(capsys):
    Sandbox(SandboxLimits(), isolate=False)
    err = capsys.readouterr().err
    assert err.startswith("rlmesh: warning: tool sandbox with isolate=False: tools run as this user"), err
    assert "use the network" in err and err.count("\n") == 1
