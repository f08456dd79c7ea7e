"""The one place that reaches into LightningCLI's private methods.

LightningCLI has no public way to get a subcommand's parser, to read a value from a
parsed config whatever the subcommand, or to build the trainer from a config dict with
extra callbacks; ``cofr fit`` needs all three (cached keys and did-you-mean, run folders,
its default callbacks). They are named here, once, and
``tests/test_training_cli.py::test_lightning_private_api_is_pinned`` fails loudly
when a Lightning upgrade moves them, instead of a fit failing somewhere deep.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.cli import LightningCLI

#: The Lightning minor version these wrappers were written and tested against.
PINNED_LIGHTNING = "2.6"
#: jsonargparse's help of an option that takes a whole section (:meth:`section_options`).
JSONARGPARSE_SECTION_HELP = "Path to a configuration file."
#: The private LightningCLI methods used below.
PRIVATE_METHODS = ("_parser", "_instantiate_trainer", "_run_subcommand")


class LightningCLIAdapter(LightningCLI):
    """LightningCLI with its private helpers behind named, documented methods."""

    def subcommand_parser(self, subcommand: str | None) -> Any:
        """The jsonargparse parser of ``subcommand`` (the top parser for None)."""
        return self._parser(subcommand)

    def config_value(self, config: Any, key: str, default: Any = None) -> Any:
        """``key`` of the parsed (or instantiated) ``config`` of the current subcommand
        (under the subcommand's name once parsed with subcommands, at the top without)."""
        return config.get(str(self.subcommand), config).get(key, default)

    def build_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        """A Trainer from its init arguments and extra callbacks (Lightning's own merge of
        configured and extra callbacks). Subclasses adjust the trainer here."""
        return self._instantiate_trainer(config, callbacks)

    def set_help(self, subcommand: str, option: str, text: str) -> None:
        """Replace the help of ``option`` (e.g. ``--ckpt_path``) in ``subcommand``'s parser.

        LightningCLI adds a subcommand's own arguments (``Trainer.fit``'s) after every hook
        that customises the parser, with the help of Lightning's docstring; jsonargparse
        has no public call to change the help of an added argument, so this sets the
        argparse action's ``help`` (a KeyError names an option that is gone)."""
        self.subcommand_parser(subcommand)._option_string_actions[option].help = text

    def section_options(self, subcommand: str) -> list[str]:
        """The options of ``subcommand`` that take a whole section (``--model``,
        ``--model.config``, ``--data``): jsonargparse's help for them reads "Path to a
        configuration file.", though an inline mapping is taken too."""
        actions = self.subcommand_parser(subcommand)._option_string_actions
        return [
            option
            for option, action in actions.items()
            if option != "--config" and action.help == JSONARGPARSE_SECTION_HELP
        ]

    def set_description(self, subcommand: str, text: str, group_title: str) -> None:
        """Replace ``subcommand``'s description and the title of the group of its own
        arguments (``--ckpt_path``): both are the first lines of Lightning's docstring of
        the Trainer method, cut mid-sentence for ``test``. The description is argparse's
        public attribute; the group is jsonargparse's named group of the method's
        arguments (``parser.groups``)."""
        parser = self.subcommand_parser(subcommand)
        parser.description = text
        parser.groups[subcommand].title = group_title

    def run_subcommand(self, subcommand: str) -> None:
        """Run ``fit``, ``validate``, ... once everything is built; a parse-only subclass
        (``training.cli.ParseOnlyCLI``: config checks, sweeps) makes this do nothing."""
        super()._run_subcommand(subcommand)

    def _run_subcommand(self, subcommand: str) -> None:
        self.run_subcommand(subcommand)


def pinned_version_ok() -> bool:
    return lightning.__version__.startswith(PINNED_LIGHTNING + ".")


def with_default_plugin(plugins: Any, kind: type, default: Callable[[], Any]) -> list[Any]:
    """A Trainer's ``plugins`` (None, one, or a list) as a list, with ``default()`` added
    unless one of them is a ``kind`` already (the user's choice stands)."""
    given = (
        [] if plugins is None else list(plugins) if isinstance(plugins, list | tuple) else [plugins]
    )
    if any(isinstance(plugin, kind) for plugin in given):
        return given
    return [*given, default()]
