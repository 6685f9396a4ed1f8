"""One-line messages for an S3 store's refusals (an S3 error code or HTTP status),
split from :mod:`slem_dask.storage.backends.s3` so the backend keeps to its requests."""

from __future__ import annotations

from .cloud import EVERY_WORKER

__all__ = ["response_message"]

_BAD_CREDENTIALS = (
    "SignatureDoesNotMatch",
    "InvalidAccessKeyId",
    "InvalidToken",
    "ExpiredToken",
    "InvalidClientTokenId",
)
_OTHER_REGION = (
    "PermanentRedirect",
    "AuthorizationHeaderMalformed",
    "IllegalLocationConstraintException",
)


def response_message(
    endpoint: str, root: str, bucket: str, code: str | None, status: int | None
) -> str | None:
    """What the store's refusal (an S3 error code or HTTP status) means, if it is known."""
    return _identity_message(endpoint, root, bucket, code) or _service_message(
        endpoint, root, code, status
    )


def _identity_message(endpoint: str, root: str, bucket: str, code: str | None) -> str | None:
    """Refusals of who asks or of where: credentials, permissions, bucket, region."""
    if code in _BAD_CREDENTIALS:
        return (
            f"the object store at {endpoint} refused the credentials for "
            f"{root} ({code}): check AWS_ACCESS_KEY_ID and "
            f"AWS_SECRET_ACCESS_KEY {EVERY_WORKER}"
        )
    if code == "403":  # a HEAD's 403 has no body: a wrong secret or no permission
        return (
            f"the object store at {endpoint} refused a request on "
            f"{root} (403 Forbidden): check AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, and that this identity may read, write, list "
            f"and delete in bucket {bucket!r} {EVERY_WORKER}"
        )
    if code in ("AccessDenied", "AllAccessDisabled", "AccountProblem"):
        return (
            f"access denied to {root} ({code}): the identity of "
            "AWS_ACCESS_KEY_ID needs read, write, list and delete on bucket "
            f"{bucket!r}, or set the keys of one that has them {EVERY_WORKER}"
        )
    if code == "NoSuchBucket":
        return (
            f"bucket {bucket!r} does not exist at {endpoint}: create "
            f"it, or fix the URL {root} or AWS_ENDPOINT_URL {EVERY_WORKER}"
        )
    if code in _OTHER_REGION:
        return (
            f"bucket {bucket!r} is in another region ({code}): set "
            f"AWS_DEFAULT_REGION to its region {EVERY_WORKER}"
        )
    return None


def _service_message(endpoint: str, root: str, code: str | None, status: int | None) -> str | None:
    """Refusals of the store itself: clock skew, overload, a request it does not implement."""
    if code == "RequestTimeTooSkewed":
        return (
            f"the object store at {endpoint} refused the requests for "
            f"{root} ({code}): this machine's clock differs from the store's by "
            "more than S3 allows (15 minutes; requests are signed with the time); "
            "set the clock right (NTP: `timedatectl set-ntp true`, or chronyd) on "
            f"the client and every dask worker, then run the same command again"
        )
    if code in ("SlowDown", "ServiceUnavailable", "503") or status == 503:
        return (
            f"the object store at {endpoint} answered 503 ({code or status}: "
            f"overloaded or unavailable) to every retry for {root}; what "
            "readers see is as before (a job commits only whole versions): wait, "
            "then run the same command again (it resumes); if it persists, check "
            "the store's health, or allow more retries (AWS_MAX_ATTEMPTS, on the "
            "client and every dask worker)"
        )
    if code == "NotImplemented" or status == 501:
        return (
            f"the object store at {endpoint} does not implement a "
            f"request slem-dask needs for {root} (conditional writes, "
            "If-None-Match): use a store that does (AWS S3, SeaweedFS)"
        )
    return None
