// A measurement prototype, not part of the package: the gate draw (Eq. 10-11), Eq. 12 and the gated
// products' gate gradients of the penalised MLP step as hand-written CPU loops, one call each, to measure
// how much of the step's overhead per-operation dispatch costs (benchmarks/bench_step_floor.py,
// benchmarks/RESULTS.md "Where the floor is"). Compiled on first use by torch.utils.cpp_extension.load.
#include <torch/extension.h>
#include <cmath>
using torch::Tensor;

// Eq. 10-11: z = clamp(lower + (upper-lower)*sigmoid((logit(u)+la)/beta), 0, 1); s saved for backward.
std::vector<Tensor> gate_forward(Tensor la, Tensor u, double beta, double lower, double upper, Tensor offsets) {
  auto z = torch::empty_like(la); auto s = torch::empty_like(la);
  int64_t nseg = offsets.numel();
  auto counts = torch::zeros({nseg}, torch::kInt64);
  auto* off = offsets.data_ptr<int64_t>(); auto* cnt = counts.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES(la.scalar_type(), "gate_forward", [&] {
    const scalar_t* a = la.data_ptr<scalar_t>(); const scalar_t* uu = u.data_ptr<scalar_t>();
    scalar_t* zz = z.data_ptr<scalar_t>(); scalar_t* ss = s.data_ptr<scalar_t>();
    const scalar_t ib = 1.0 / beta, sc = upper - lower, lo = lower;
    int64_t start = 0;
    for (int64_t k = 0; k < nseg; ++k) {
      int64_t c = 0;
      for (int64_t i = start; i < off[k]; ++i) {
        scalar_t v = (std::log(uu[i]) - std::log1p(-uu[i]) + a[i]) * ib;
        scalar_t sg = 1 / (1 + std::exp(-v));
        ss[i] = sg;
        scalar_t zb = sg * sc + lo;
        zb = zb < 0 ? 0 : (zb > 1 ? 1 : zb);
        zz[i] = zb; c += zb != 0;
      }
      cnt[k] = c; start = off[k];
    }
  });
  return {z, s, counts};
}

Tensor gate_backward(Tensor grad_z, Tensor s, Tensor z, double beta, double lower, double upper) {
  auto g = torch::empty_like(s);
  AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "gate_backward", [&] {
    const scalar_t* gz = grad_z.data_ptr<scalar_t>(); const scalar_t* ss = s.data_ptr<scalar_t>();
    const scalar_t* zz = z.data_ptr<scalar_t>(); scalar_t* out = g.data_ptr<scalar_t>();
    const scalar_t f = (upper - lower) / beta;
    for (int64_t i = 0; i < s.numel(); ++i)
      out[i] = (zz[i] > 0 && zz[i] < 1) ? gz[i] * f * ss[i] * (1 - ss[i]) : 0;
  });
  return g;
}

// Eq. 12 weighted: sum_i w_i sigmoid(la_i - shift), and its gradient
Tensor l0_forward(Tensor la, Tensor w, double shift) {
  auto out = torch::empty({}, la.options());
  AT_DISPATCH_FLOATING_TYPES(la.scalar_type(), "l0f", [&] {
    const scalar_t* a = la.data_ptr<scalar_t>(); const scalar_t* ww = w.data_ptr<scalar_t>();
    double acc = 0;
    for (int64_t i = 0; i < la.numel(); ++i) acc += ww[i] / (1 + std::exp(shift - a[i]));
    *out.data_ptr<scalar_t>() = acc;
  });
  return out;
}
Tensor l0_backward(Tensor grad, Tensor la, Tensor w, double shift) {
  auto g = torch::empty_like(la);
  AT_DISPATCH_FLOATING_TYPES(la.scalar_type(), "l0b", [&] {
    const scalar_t* a = la.data_ptr<scalar_t>(); const scalar_t* ww = w.data_ptr<scalar_t>();
    scalar_t* o = g.data_ptr<scalar_t>(); scalar_t gr = grad.item<scalar_t>();
    for (int64_t i = 0; i < la.numel(); ++i) { scalar_t p = 1 / (1 + std::exp(shift - a[i])); o[i] = gr * ww[i] * p * (1 - p); }
  });
  return g;
}

// The first layer's gate gradient without a temporary: out_i = sum_o A[o,i] B[o,i] / z_i (0 where z_i == 0)
Tensor column_dot_div(Tensor A, Tensor B, Tensor z) {
  int64_t O = A.size(0), I = A.size(1);
  auto out = torch::zeros({I}, A.options());
  AT_DISPATCH_FLOATING_TYPES(A.scalar_type(), "cdot", [&] {
    const scalar_t* a = A.data_ptr<scalar_t>(); const scalar_t* b = B.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>(); const scalar_t* zz = z.data_ptr<scalar_t>();
    for (int64_t r = 0; r < O; ++r) {
      const scalar_t* ar = a + r * I; const scalar_t* br = b + r * I;
      for (int64_t i = 0; i < I; ++i) o[i] += ar[i] * br[i];
    }
    for (int64_t i = 0; i < I; ++i) o[i] = zz[i] == 0 ? 0 : o[i] / zz[i];
  });
  return out;
}

// A hidden layer's backward from gxz = g W (B x in): grad_x = gxz * z and grad_z = sum_b gxz * x in one pass
std::vector<Tensor> hidden_backward(Tensor gxz, Tensor x, Tensor z) {
  int64_t Bn = gxz.size(0), I = gxz.size(1);
  auto gx = torch::empty_like(gxz); auto gzv = torch::zeros({I}, z.options());
  AT_DISPATCH_FLOATING_TYPES(gxz.scalar_type(), "hb", [&] {
    const scalar_t* g = gxz.data_ptr<scalar_t>(); const scalar_t* xx = x.data_ptr<scalar_t>();
    const scalar_t* zz = z.data_ptr<scalar_t>(); scalar_t* o = gx.data_ptr<scalar_t>(); scalar_t* q = gzv.data_ptr<scalar_t>();
    for (int64_t b = 0; b < Bn; ++b) {
      const scalar_t* gr = g + b * I; const scalar_t* xr = xx + b * I; scalar_t* orow = o + b * I;
      for (int64_t i = 0; i < I; ++i) { orow[i] = gr[i] * zz[i]; q[i] += gr[i] * xr[i]; }
    }
  });
  return {gx, gzv};
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gate_forward", &gate_forward); m.def("gate_backward", &gate_backward);
  m.def("l0_forward", &l0_forward); m.def("l0_backward", &l0_backward);
  m.def("column_dot_div", &column_dot_div); m.def("hidden_backward", &hidden_backward);
}
