"""User-facing errors. The CLI prints them as one line and exits non-zero, without a traceback."""


class StudyrunnerError(Exception):
    """An error the user can mend: the message names the file or field and what is allowed."""

    exit_code = 1


class UsageError(StudyrunnerError):
    """A command-line value that cannot be read (a `--where` filter, a seed list, a URL written wrong): exit 2,
    as click's own usage errors."""

    exit_code = 2


class SpecError(StudyrunnerError):
    """A study file that cannot be loaded, validated or compiled."""

    exit_code = 2
