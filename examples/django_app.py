"""Django: enqueue a job when the transaction that made its data commits.

An order is saved in a transaction; the job that mails its receipt is added
by `transaction.on_commit`, so a rolled-back order sends nothing and the
worker never reads an order that is not in the database yet.  One file for
the example: settings, a model, a view, the URLs, and the worker's app.

    make run                                             # a cluster on 7711-7713
    .venv/bin/python examples/django_app.py demo         # two orders: one commits, one rolls back
    cd examples && ../.venv/bin/disque worker django_app:tasks --burst   # mails the receipt
    .venv/bin/python examples/django_app.py runserver    # or any manage.py command; POST /orders/<item>

Needs Django (`.venv/bin/pip install django`).  The database is a SQLite
file next to this one (`django_app.sqlite3`); `demo` creates its table.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import django
from django.conf import settings

settings.configure(
    DEBUG=False,
    ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__,
    SECRET_KEY="example only",
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": Path(__file__).with_name("django_app.sqlite3")}},
    DEFAULT_AUTO_FIELD="django.db.models.AutoField",
)
django.setup()

from django.db import connection, models, transaction  # noqa: E402  (after settings)
from django.http import HttpRequest, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402

from disque.client import Job  # noqa: E402
from disque.client.worker import App  # noqa: E402

tasks = App()  # $DISQUE_NODES, or 127.0.0.1:7711


class Order(models.Model):
    item = models.CharField(max_length=100)

    class Meta:
        app_label = "shop"


@tasks.job("receipts", retries=3)
def mail_receipt(job: Job) -> None:
    order = Order.objects.get(pk=int(job.body))  # committed before the job existed: always there
    print(f"receipt mailed for order {order.pk}: {order.item}", flush=True)


@csrf_exempt
def place_order(request: HttpRequest, item: str) -> JsonResponse:
    with transaction.atomic():
        order = Order.objects.create(item=item)
        # Added once the transaction commits; nothing if it rolls back.
        transaction.on_commit(functools.partial(mail_receipt.send, str(order.pk)))
        if item == "out-of-stock":
            transaction.set_rollback(True)
            return JsonResponse({"error": "out of stock"}, status=409)
    return JsonResponse({"order": order.pk})


urlpatterns = [path("orders/<str:item>", place_order)]


def demo() -> None:
    from django.test import Client

    if "shop_order" not in connection.introspection.table_names():
        with connection.schema_editor() as schema:
            schema.create_model(Order)
    http = Client()
    for item in ("lamp", "out-of-stock"):
        response = http.post(f"/orders/{item}")
        print(response.status_code, response.json(), flush=True)
    tasks.close()


if __name__ == "__main__":
    if sys.argv[1:] == ["demo"]:
        demo()
    else:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "")  # configured above
        from django.core.management import execute_from_command_line

        execute_from_command_line(sys.argv)
