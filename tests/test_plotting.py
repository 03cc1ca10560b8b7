"""t5lite.plotting: tick labels read as plain decimals on the ranges where matplotlib's defaults
write 6.9×10⁻¹ or a ×10⁻⁵ offset, and an axis of names keeps its names."""
import pytest

from t5lite.plotting import plain_ticks, pyplot


def drawn_labels(ax, axis="y"):
    """The tick labels matplotlib draws inside the view (major and minor), with their positions."""
    ax.figure.canvas.draw()
    which = ax.yaxis if axis == "y" else ax.xaxis
    low, high = sorted(ax.get_ylim() if axis == "y" else ax.get_xlim())
    ticks = which.get_major_ticks() + which.get_minor_ticks()
    return [(t.get_loc(), t.label1.get_text()) for t in ticks if t.label1.get_text() and low <= t.get_loc() <= high]


@pytest.fixture
def axes():
    plt = pyplot()
    fig, ax = plt.subplots()
    yield ax
    plt.close(fig)


def test_a_short_log_range_is_labelled_in_plain_decimals(axes):
    axes.plot([1, 2], [0.68, 0.75])
    axes.set_yscale("log")
    assert any("times10" in text for _, text in drawn_labels(axes))   # matplotlib's default: 6.9×10⁻¹
    plain_ticks(axes)
    labels = drawn_labels(axes)
    assert labels and all(text == format(loc, ".3g") for loc, text in labels), labels   # 0.69, 0.7, ...


def test_a_small_linear_range_has_no_offset_nor_scientific_labels(axes):
    axes.plot([1, 2], [1e-5, 3e-5])
    axes.figure.canvas.draw()
    assert axes.yaxis.get_offset_text().get_text()   # matplotlib's default: labels 1.0 ... 3.0 under "1e-5"
    plain_ticks(axes)
    labels = drawn_labels(axes)
    assert axes.yaxis.get_offset_text().get_text() == ""
    assert labels and all(float(text) == pytest.approx(loc) and "e" not in text for loc, text in labels), labels


def test_integer_x_puts_ticks_on_whole_numbers_and_names_stay(axes):
    axes.barh(["mlm", "mlm_nsp"], [1.5, 2.5])
    axes.plot([0, 2], [0, 1])
    plain_ticks(axes, integer_x=True)
    assert [text for _, text in drawn_labels(axes)] == ["mlm", "mlm_nsp"]
    assert [text for _, text in drawn_labels(axes, "x")] == ["0", "1", "2"]
