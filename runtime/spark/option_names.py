"""Source option names as Spark users write them: camelCase, with ftlayer's snake_case kept.

Spark's own sources name their options in camelCase (``maxFilesPerTrigger``,
``checkpointLocation``) and match them case-insensitively. ftlayer's sources read the same
options under their snake_case names (``max_records_per_batch``); :class:`SourceOptionMap`
makes both spellings one option: a name is compared with its underscores removed and case
folded, so ``maxRecordsPerBatch``, ``MAXRECORDSPERBATCH`` and ``max_records_per_batch`` are the
same key. Giving one option twice under two spellings with different values is refused
(ConfigError naming both), never resolved by whichever Spark happened to pass last.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from ftlayer.errors import ConfigError

__all__ = ["FT_FORMAT", "SourceOptionMap", "camel_case", "option_key"]

# the FT source's name in readStream.format(...): here, where its options and its light DataSource
# module (runtime.spark.ft_data_sources) can both import it
FT_FORMAT = "ftlayer"


def option_key(name: str) -> str:
    """The spelling-free key of an option name: no underscores, case folded."""
    return name.replace("_", "").casefold()


def camel_case(snake: str) -> str:
    """``max_records_per_batch`` -> ``maxRecordsPerBatch`` (the spelling the docs show first)."""
    head, *rest = snake.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


class SourceOptionMap(Mapping[str, str]):
    """Read-only options looked up by any spelling of their name (see the module notes).

    Iterating yields each option's key as :func:`option_key` gives it. Values are kept as
    strings, as Spark passes them.
    """

    def __init__(self, options: Mapping[str, object], what: str) -> None:
        self._values: dict[str, str] = {}
        spelled: dict[str, str] = {}
        for raw_name, raw_value in options.items():
            name, value = str(raw_name), str(raw_value)
            key = option_key(name)
            if key in self._values and self._values[key] != value:
                msg = (f"{what}: option {spelled[key]!r}={self._values[key]!r} and {name!r}={value!r} are the "
                       f"same option spelled twice with different values; give it once")
                raise ConfigError(msg)
            self._values[key] = value
            spelled[key] = name

    def __getitem__(self, name: str) -> str:
        return self._values[option_key(name)]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and option_key(name) in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)
