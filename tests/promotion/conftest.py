import pytest


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory):
    """One real sqlite MLflow store for the promotion tests (creating one costs ~10 s on a busy
    machine); tests keep apart by registered-model name."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
