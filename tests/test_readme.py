"""README.md's set-up commands: CI (.ci/run) runs them verbatim, and the test command installs
torch, so that following it runs the torch adapter's tests too."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def setup_commands():
    """The command lines of the README's "Set-up: two commands" block, comments left out."""
    block = re.search(r"## Set-up: two commands\s+```bash\n(.*?)```", README, re.S).group(1)
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_ci_runs_the_readme_commands_verbatim():
    commands = setup_commands()
    assert len(commands) == 2, commands
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for command in commands:
        assert any(line == command or line.startswith(command + " ") for line in ci), command
    assert "torch" in re.search(r'"\.\[(.*?)\]"', commands[1]).group(1).split(",")
    assert "pytest" in commands[1]
    # plain torch from PyPI is a CUDA build: the README says where the CPU one is
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in README
