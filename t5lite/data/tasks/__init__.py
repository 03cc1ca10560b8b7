"""Built-in tasks; importing a module registers its tasks."""
from t5lite.data.tasks import pretraining  # noqa: F401
