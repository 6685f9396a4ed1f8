"""adlfs's file system with the deadlines of :mod:`.deadlines`: fsspec makes it for
every ``az://`` / ``abfs://`` URL once :func:`.deadlines.install` registered it
(imported only then: slem-dask imports no Azure SDK before an az:// path is used)."""

from __future__ import annotations

import adlfs

from .deadlines import current

__all__ = ["DeadlineAzureBlobFileSystem", "limit_azure_client"]


def limit_azure_client(service_client) -> None:
    """Give an Azure service client (and the container and blob clients made from it,
    which share its transport and policies) the connect and read timeouts and the
    bounded tries of :mod:`.deadlines`. azure-storage-blob's defaults are 20 s and 60 s,
    four tries 15 + 3**i s apart; adlfs passes timeouts to its uploads and downloads
    only, and no retry settings at all."""
    policy = current()
    transport = getattr(service_client._pipeline, "_transport", None)
    config = getattr(transport, "connection_config", None)
    if config is not None:
        config.timeout, config.read_timeout = policy.connect, policy.timeout
    retry = getattr(service_client._config, "retry_policy", None)
    if retry is not None:
        for name in ("total_retries", "connect_retries", "read_retries", "status_retries"):
            setattr(retry, name, policy.attempts - 1)
        retry.initial_backoff = policy.azure_backoff_start
        retry.increment_base = policy.azure_backoff_base
        retry.random_jitter_range = policy.azure_jitter


class DeadlineAzureBlobFileSystem(adlfs.AzureBlobFileSystem):
    """adlfs's file system whose every request has the deadlines of :mod:`.deadlines`."""

    def __init__(self, *args, **kwargs):
        policy = current()
        for key, value in policy.adlfs_options().items():
            if kwargs.get(key) is None:
                kwargs[key] = value
        super().__init__(*args, **kwargs)

    def do_connect(self):
        super().do_connect()
        limit_azure_client(self.service_client)
