"""The `kvscope` command: every subcommand and flag, from cli/main.py's build_parser()."""

import argparse

from docs.gen.markdown import code, page, table


def subcommands(parser: argparse.ArgumentParser, prefix: str = "kvscope"):
    """(command line, parser, help) of every command under parser, depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                command = f"{prefix} {name}"
                yield command, sub, helps.get(name, "")
                yield from subcommands(sub, command)


def flags(parser: argparse.ArgumentParser) -> list[tuple]:
    """(flag, value, default, meaning) of each argument but help and subcommands."""
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        name = ", ".join(action.option_strings) or action.dest
        value = ""
        if action.nargs != 0:
            metavar = action.metavar
            value = (" ".join(metavar) if isinstance(metavar, tuple) else metavar) or (
                "{" + ",".join(map(str, action.choices)) + "}"
                if action.choices
                else getattr(action.type, "__name__", "") or "TEXT"
            )
        if action.required:
            default = "required"
        elif action.default in (None, argparse.SUPPRESS) or action.nargs == 0:
            default = ""
        else:
            default = code(action.default)
        meaning = _formatter(parser)._expand_help(action) if action.help else ""
        rows.append((code(name), code(value) if value else "", default, meaning))
    return rows


def _formatter(parser: argparse.ArgumentParser) -> argparse.HelpFormatter:
    """A fixed width, whatever the terminal: the page must not depend on where it was made."""
    return argparse.HelpFormatter(parser.prog, width=100)


def usage(parser: argparse.ArgumentParser) -> str:
    formatter = _formatter(parser)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def has_arguments(parser: argparse.ArgumentParser) -> bool:
    return any(
        not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
        for a in parser._actions
    )


def render() -> str:
    from kvscope.cli.main import build_parser

    parser = build_parser()
    index = table(
        ("command", "what"), [(code(c), h.replace("%%", "%")) for c, _, h in subcommands(parser)]
    )
    parts = [f"## Commands\n\n{index}"]
    for command, sub, help_text in subcommands(parser):
        about = (sub.description or help_text or "").replace("%%", "%").strip()
        text = f"## {command}\n\n{about}\n\n"
        text += f"```text\n{usage(sub)}\n```\n"
        if has_arguments(sub):
            text += "\n" + table(("argument", "value", "default", "meaning"), flags(sub))
        parts.append(text)
    return page(
        "Command line",
        "Every `kvscope` subcommand and its flags, from the parser `kvscope --help` prints."
        " `kvscope COMMAND --help` shows the same.",
        *parts,
    )
