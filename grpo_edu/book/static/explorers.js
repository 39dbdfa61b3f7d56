/* Chapter 2's four explorers, live in a static page: no kernel, no network, no modules.
 *
 * The Python explorers (grpo_edu/widgets/*.py) are the reference. Each `compute[kind]`
 * below mirrors its `compute_state`, operation for operation where the float result
 * depends on the order (torch's and numpy's summation orders included), so the page
 * shows the digits the notebook shows. grpo_edu/book/explorer_specs.py sends every
 * constant (slider ranges, defaults, chapter 1's ratios, the sampler's uniforms) as the
 * `spec`; tests/test_html_explorers.py compares every state with Python's.
 *
 * API (window.GrpoExplorers):
 *   compute[kind](config, spec) -> state   kind: advantage | clipping | kl | length_bias;
 *                                          config and state use compute_state's argument
 *                                          and dataclass field names
 *   html[kind](state, spec) -> {table, notes}  the HTML the Python show() writes, string for string
 *   format.fixed(x, d) = f"{x:.{d}f}"   format.exp(x, d) = f"{x:.{d}e}"
 *   format.fmt(x, d = 4) = widgets._base.fmt   format.repr(x) = repr(float(x))
 *   mount(element), mountAll()             mountAll() runs on DOMContentLoaded
 *
 * DOM contract. The builder writes
 *   <div class="grpo-live" data-explorer="KIND">
 *     <script type="application/json" class="grpo-explorer-spec">SPEC</script></div>
 * mount() adds the classes grpo-explorer and the Python css name (grpo-advantage-explorer,
 * ...) to that element, sets element.grpoExplorer = {kind, spec, state, config(), updates,
 * lastUpdateMs, html: {table, notes}}, and builds inside it:
 *   a range slider   <div class="grpo-slider CLASS-wrap"><label>description</label>
 *                      <input type="range" class="CLASS"><output class="grpo-readout"></div>
 *                    CLASS: grpo-control-G, grpo-control-shift, grpo-reward-p{b}-r{i} (advantage);
 *                    grpo-control-advantage, -epsilon-low, -epsilon-high (clipping);
 *                    grpo-logit-x{x}, grpo-ref-logit-x{x}, grpo-control-samples (kl, the
 *                    samples slider runs over the index of the sizes); grpo-control-G,
 *                    -shortest, -longest (both in a <div class="grpo-range">), -max-length
 *                    (length_bias; max-length runs over the index of the lengths)
 *   a toggle         <div class="grpo-toggle CLASS-wrap"><span class="grpo-label">..</span>
 *                      <button class="CLASS" data-value="OPTION" aria-pressed="true|false">
 *                    CLASS: grpo-control-scale, grpo-control-std (advantage)
 *   <div class="grpo-table-box"> the table, <div class="grpo-notes-box"> the notes,
 *   <div class="grpo-plot"> an inline SVG.
 * Every slider updates on `input`, synchronously (compute, then table, notes and plot).
 */
(function () {
  "use strict";

  // ======================================================================= formatting
  // Python's format(): correctly rounded like JavaScript's toFixed / toExponential, except
  // on an exact tie (a binary value exactly halfway between two decimals, like 0.03125),
  // where Python rounds to the even digit and JavaScript away from zero.

  /** |x| as m * 2^k exactly (m a BigInt): the binary value, for exact decimal comparisons. */
  function exactBinary(x) {
    let k = 0;
    while (!Number.isInteger(x)) { x *= 2; k -= 1; }      // exact: scaling by 2
    return [BigInt(x), k];
  }

  /** Is |x| exactly (N - 1/2) * 10^q, halfway below the decimal N * 10^q? */
  function isTie(x, N, q) {
    const [m, k] = exactBinary(Math.abs(x));
    let left = 2n * m, right = 2n * N - 1n;                // 2|x| = (2N - 1) 10^q, in integers
    if (k >= 0) left <<= BigInt(k); else right <<= BigInt(-k);
    if (q >= 0) right *= 10n ** BigInt(q); else left *= 10n ** BigInt(-q);
    return left === right;
  }

  /** The digits of N with d of them after the decimal point. */
  function withPoint(N, d) {
    const digits = N.toString().padStart(d + 1, "0");
    return d ? `${digits.slice(0, -d)}.${digits.slice(-d)}` : digits;
  }

  function signOf(x) { return x < 0 || Object.is(x, -0) ? "-" : ""; }

  function special(x) { return Number.isNaN(x) ? "nan" : `${signOf(x)}inf`; }

  /** Python's f"{x:.{d}f}". */
  function fixed(x, d) {
    if (!Number.isFinite(x)) return special(x);
    const text = Math.abs(x) < 1e21 ? Math.abs(x).toFixed(d) : `${BigInt(Math.abs(x))}.${"0".repeat(d)}`;
    let N = BigInt(text.replace(".", ""));
    if (N % 2n === 1n && isTie(x, N, -d)) N -= 1n;         // the tie goes to the even digit
    return signOf(x) + withPoint(N, d);
  }

  /** Python's f"{x:.{d}e}": as fixed, with a sign and at least two digits in the exponent. */
  function exp(x, d) {
    if (!Number.isFinite(x)) return special(x);
    const [mantissa, power] = Math.abs(x).toExponential(d).split("e");
    const e = Number(power);
    let N = BigInt(mantissa.replace(".", ""));
    if (N % 2n === 1n && isTie(x, N, e - d)) N -= 1n;
    return `${signOf(x)}${withPoint(N, d)}e${e < 0 ? "-" : "+"}${String(Math.abs(e)).padStart(2, "0")}`;
  }

  /** widgets._base.fmt: f"{round(x, d) + 0.0:+.{d}f}", signed and never "-0.0000". */
  function fmt(x, d = 4) {
    const text = fixed(Math.abs(x), d);
    return (x < 0 && !/^[0.]+$/.test(text) ? "-" : "+") + text;
  }

  /** Python's repr(float(x)): the shortest digits that round-trip (JavaScript finds the
   * same ones), written as Python writes them ("1.0", "1e-05", "-0.0"). */
  function repr(x) {
    if (!Number.isFinite(x)) return special(x);
    if (x === 0) return `${signOf(x)}0.0`;
    const [mantissa, power] = Math.abs(x).toExponential().split("e");
    const digits = mantissa.replace(".", ""), e = Number(power);
    if (e < -4 || e >= 16) return `${signOf(x)}${mantissa}e${e < 0 ? "-" : "+"}${String(Math.abs(e)).padStart(2, "0")}`;
    if (e < 0) return `${signOf(x)}0.${"0".repeat(-e - 1)}${digits}`;
    return `${signOf(x)}${digits.slice(0, e + 1).padEnd(e + 1, "0")}.${digits.slice(e + 1) || "0"}`;
  }

  /** An ipywidgets readout_format ("+.2f", ".2f", "d") applied to a slider's value. */
  function readout(format, value) {
    const match = /^(\+?)\.(\d+)f$/.exec(format);
    if (match) return (match[1] && value >= 0 ? "+" : "") + fixed(value, Number(match[2]));
    if (format === "d") return String(value);
    throw new Error(`readout_format must be "d" or like "+.2f" / ".2f", got ${JSON.stringify(format)}`);
  }

  // ======================================================================= sums as torch and numpy add
  // Float addition is not associative: the last bit of a sum depends on its order, and the
  // last bit decides how an exact tie like 0.03125 prints. These mirror the libraries' orders.

  function runningSum(values) {
    let total = 0;
    for (const v of values) total += v;
    return total;
  }

  /** torch.sum of a contiguous float64 row on x86 CPUs: its reduction kernel (the AVX2 one;
   * AVX512 machines run it too) adds vectors of 4 lanes, vector i into accumulator i % 4
   * while whole groups of 4 vectors remain, the rest into accumulator 0; then it adds the
   * accumulators, and finally the leftover scalars followed by the 4 lanes. Exact for rows
   * of fewer than 256 numbers (torch adds longer ones in levels); the explorers add <= 16. */
  function torchSum(row) {
    const vectors = Math.floor(row.length / 4);
    if (vectors === 0) return runningSum(row);
    const acc = [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]];
    const grouped = vectors - (vectors % 4);
    for (let i = 0; i < vectors; i++) {
      const a = acc[i < grouped ? i % 4 : 0];
      for (let lane = 0; lane < 4; lane++) a[lane] += row[4 * i + lane];
    }
    for (let k = 1; k < 4; k++) for (let lane = 0; lane < 4; lane++) acc[0][lane] += acc[k][lane];
    let total = runningSum(row.slice(4 * vectors));         // the leftover scalars first,
    for (const lane of acc[0]) total += lane;                // then the 4 lanes in order
    return total;
  }

  /** torch.std(row, correction) along a dimension: Welford's running mean and M2. */
  function torchStd(row, correction) {
    let mean = 0, m2 = 0;
    row.forEach((x, i) => {
      const delta = x - mean;
      mean += delta / (i + 1);
      m2 += delta * (x - mean);
    });
    return Math.sqrt(m2 / Math.max(row.length - correction, 0));
  }

  /** torch.std(tensor, correction) over all elements: two passes, the squares summed in order. */
  function torchStdAll(values, correction) {
    const mean = torchSum(values) / values.length;
    let squares = 0;
    for (const x of values) squares += (x - mean) * (x - mean);
    return Math.sqrt(squares / Math.max(values.length - correction, 0));
  }

  /** numpy's pairwise summation (np.sum, np.mean, np.std of a contiguous float64 array):
   * below 8 numbers a running sum, up to 128 eight interleaved accumulators, beyond
   * that the two halves (cut at a multiple of 8) summed separately. */
  function numpySum(values, start = 0, n = values.length) {
    if (n < 8) {
      let total = -0;
      for (let i = start; i < start + n; i++) total += values[i];
      return total;
    }
    if (n <= 128) {
      const r = values.slice(start, start + 8);
      let i = 8;
      for (; i + 8 <= n; i += 8) for (let k = 0; k < 8; k++) r[k] += values[start + i + k];
      let total = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
      for (; i < n; i++) total += values[start + i];
      return total;
    }
    const half = Math.floor(n / 2) - (Math.floor(n / 2) % 8);
    return numpySum(values, start, half) + numpySum(values, start + half, n - half);
  }

  /** np.std (population): the mean, then the mean of the squared deviations. */
  function numpyStd(values) {
    const mean = numpySum(values) / values.length;
    return Math.sqrt(numpySum(values.map(v => (v - mean) * (v - mean))) / values.length);
  }

  // ======================================================================= advantages

  /** grpo_edu.algorithm.reference.group_std: the mean shifted by the first reward, then the std.
   * (Python squares with **, C's pow(), which in rare cases differs from d * d in the last bit.) */
  function groupStd(rewards, std) {
    const first = rewards[0], n = rewards.length;
    const mean = first + runningSum(rewards.map(r => r - first)) / n;
    const squares = runningSum(rewards.map(r => (r - mean) * (r - mean)));
    return Math.sqrt(squares / (std === "population" ? n : n - 1));
  }

  /** grpo_edu.algorithm.advantages.group_advantages on rewards (B, G):
   * A = (r - mean of its group) / (std + eps), the std per group ("group"), over the whole
   * batch ("batch") or none at all ("none", Dr. GRPO); an all-equal group gets exact zeros. */
  function groupAdvantages(rewards, scale, std, eps) {
    const correction = std === "population" ? 0 : 1;
    const batchStd = scale === "batch" ? torchStdAll(rewards.flat(), correction) : null;
    return rewards.map(row => {
      if (row.every(r => r === row[0])) return row.map(() => 0);
      const mean = torchSum(row) / row.length;
      if (scale === "none") return row.map(r => r - mean);
      const divisor = (scale === "group" ? torchStd(row, correction) : batchStd) + eps;
      return row.map(r => (r - mean) / divisor);
    });
  }

  function maxAbs(values) { return Math.max(...values.map(Math.abs)); }

  /** widgets/advantages.py compute_state. */
  function computeAdvantage({ rewards, scale, std, shift }, spec) {
    const shifted = rewards.map(row => row.map(r => r + shift));
    const advantages = groupAdvantages(shifted, scale, std, spec.eps);
    const unshifted = groupAdvantages(rewards, scale, std, spec.eps);
    const G = shifted[0].length;
    const means = shifted.map(row => numpySum(row) / G);
    const scales = shifted.map(row => (scale === "group" ? groupStd(row, std)       // the std divided by
      : scale === "batch" ? groupStd(shifted.flat(), std) : 1));
    const silent = shifted.map(row => row.every(r => r === row[0]));
    const shiftChange = Math.max(...advantages.map((row, b) => maxAbs(row.map((a, i) => a - unshifted[b][i]))));

    const notes = [];
    shifted.forEach((row, b) => {
      if (silent[b]) notes.push(`prompt ${b + 1}: all ${G} rewards are ${fmt(row[0], 2)}, so every advantage is `
        + `${fixed(maxAbs(advantages[b]), 4)}: this group teaches nothing (its policy gradient is zero)`);
    });
    if (shift !== 0) notes.push(`shifting every reward by ${fmt(shift, 2)} changes the advantages by at most `
      + `${fixed(shiftChange, 4)}: only differences within a group matter`);
    if (scale === "group" && !silent.some(Boolean)) {
      const [s0, s1] = shifted.map(row => fixed(groupStd(row, std), 4));
      const [u0, u1] = advantages.map(row => fixed(groupStd(row, std), 4));
      notes.push(`group scaling: reward stds ${s0} and ${s1} both become advantage stds ${u0} and ${u1}`);
    }
    return { rewards: shifted, advantages, scale, std, shift, means, scales, silent, shift_change: shiftChange, notes };
  }

  // ======================================================================= clipping

  /** grpo_edu.algorithm.estimators.clipped_objective: per token, objective = min(rho A, clip(rho,
   * 1 - eps_low, 1 + eps_high) A) and its derivative in rho, as autograd finds it through
   * grpo_loss. `lossRatio` is rho as grpo_loss sees it (exp(log rho), within an ulp of rho). */
  function clippedObjective(ratio, lossRatio, A, epsLow, epsHigh) {
    const low = 1 - epsLow, high = 1 + epsHigh;
    const objective = [], gradient = [], clipped = [];
    lossRatio.forEach((rho, i) => {
      const unclipped = rho * A, clippedTerm = Math.min(Math.max(rho, low), high) * A;
      // torch.minimum sends the gradient to the smaller branch (half to each on a tie);
      // the clipped branch passes it on only where clamp() did not bind.
      const share = unclipped === clippedTerm ? 0.5 : 1;
      const passed = (unclipped <= clippedTerm ? share : 0)
        + (unclipped >= clippedTerm && low <= rho && rho <= high ? share : 0);
      objective.push(Math.min(unclipped, clippedTerm));
      // autograd's d obj / d log rho = passed A rho, divided by the caller's rho
      gradient.push((passed * A) * rho / ratio[i] + 0);
      clipped.push(gradient[i] === 0 && A !== 0);
    });
    return { ratio, objective, gradient, clipped };
  }

  /** widgets/clipping.py compute_state. */
  function computeClipping({ advantage: A, epsilon_low: epsLow, epsilon_high: epsHigh }, spec) {
    const curve = clippedObjective(spec.grid, spec.grid_loss_ratio, A, epsLow, epsHigh);
    const tokens = clippedObjective(spec.token_ratio, spec.token_loss_ratio, A, epsLow, epsHigh);
    const labels = spec.token_labels;
    let noGradient, notes;
    if (A > 0) {
      noGradient = [1 + epsHigh, Infinity];
      notes = [`A > 0: past rho = ${fixed(1 + epsHigh, 4)} the clipped branch wins; the objective is flat at `
        + `${fmt((1 + epsHigh) * A)} and the gradient is 0: no reward for pushing the token's probability further`,
      `below rho = ${fixed(1 - epsLow, 4)} nothing clips (the min keeps rho A): the gradient ${fmt(A)} pulls `
        + "the token back up"];
    } else if (A < 0) {
      noGradient = [0, 1 - epsLow];
      notes = [`A < 0: below rho = ${fixed(1 - epsLow, 4)} the clipped branch wins; the objective is flat at `
        + `${fmt((1 - epsLow) * A)} and the gradient is 0: no reward for pushing the token's probability further down`,
      `above rho = ${fixed(1 + epsHigh, 4)} nothing clips (the min keeps rho A): the gradient ${fmt(A)} pushes `
        + "the token back down"];
    } else {
      noGradient = null;
      notes = ["A = 0: the objective and its gradient are 0 for every ratio; this token neither gains nor loses "
        + "probability (its reward equals its group's mean, as when all rewards are equal)"];
    }
    const hit = labels.filter((_, k) => tokens.clipped[k]);
    notes.push(`chapter 1's tokens clipped at this A: ${hit.length ? hit.join(", ") : "none"} `
      + `(${hit.length} of ${labels.length})`);
    return { advantage: A, epsilon_low: epsLow, epsilon_high: epsHigh, curve, tokens, token_labels: labels,
      no_gradient: noGradient, notes };
  }

  // ======================================================================= KL

  /** grpo_edu.algorithm.reference.log_softmax of one row: shift by the max, subtract log sum exp. */
  function logSoftmax(logits) {
    const top = Math.max(...logits);
    const shifted = logits.map(z => z - top);
    const logTotal = Math.log(numpySum(shifted.map(Math.exp)));
    return shifted.map(s => s - logTotal);
  }

  /** grpo_edu.algorithm.kl.kl_estimate, with d = log pi_ref(x) - log pi(x) (Schulman's estimators). */
  const KL_ESTIMATORS = {
    k1: d => -d,                          // unbiased, negative where pi_ref > pi
    k2: d => 0.5 * d * d,                 // biased, low variance
    k3: d => Math.exp(d) - d - 1,         // unbiased and >= 0
  };

  /** numpy's Generator.choice(V, size=n, p=probs) given its n uniforms: invert the
   * cumulative distribution (the first index whose cdf exceeds u: searchsorted side="right"). */
  function sampleTokens(probs, uniforms, n) {
    let running = 0;
    const cumulative = probs.map(p => (running += p));
    const cdf = cumulative.map(c => c / cumulative[cumulative.length - 1]);
    const samples = new Array(n);
    for (let j = 0; j < n; j++) {
      let x = 0;
      while (x < cdf.length && cdf[x] <= uniforms[j]) x++;
      samples[j] = x;
    }
    return samples;
  }

  /** widgets/kl.py compute_state. */
  function computeKL({ logits, ref_logits: refLogits, num_samples: n }, spec) {
    const logp = logSoftmax(logits), refLogp = logSoftmax(refLogits);
    const probs = logp.map(Math.exp);
    const logRatio = refLogp.map((r, x) => r - logp[x]);
    const samples = sampleTokens(probs, spec.uniforms, n);
    const perToken = {}, expected = {}, sampleMean = {}, sampleStd = {};
    for (const name of spec.estimators) {
      perToken[name] = logRatio.map(KL_ESTIMATORS[name]);
      expected[name] = runningSum(probs.map((p, x) => p * perToken[name][x]));
      const drawn = samples.map(x => perToken[name][x]);
      sampleMean[name] = numpySum(drawn) / n;
      sampleStd[name] = numpyStd(drawn);
    }
    // grpo_edu.algorithm.estimators.categorical_kl: sum_x pi(x) (log pi(x) - log pi_ref(x))
    const exact = numpySum(probs.map((p, x) => p * (logp[x] - refLogp[x])));

    const notes = [];
    if (logp.every((l, x) => Math.abs(l - refLogp[x]) <= 1e-12)) {
      notes.push("pi = pi_ref: every estimator is 0 on every sample, and so is the KL");
    } else {
      notes.push(`on tokens drawn from pi, k1 and k3 are unbiased: their exact means ${fmt(expected.k1)} and `
        + `${fmt(expected.k3)} equal the KL ${fmt(exact)}; k2's mean is ${fmt(expected.k2)} `
        + `(bias ${fmt(expected.k2 - exact)})`);
      notes.push(`per-sample std over ${n} draws: k1 ${fixed(sampleStd.k1, 4)}, k2 ${fixed(sampleStd.k2, 4)}, `
        + `k3 ${fixed(sampleStd.k3, 4)}`);
      const negative = perToken.k1.flatMap((k, x) => (k < 0 ? [`x${x}`] : []));
      if (negative.length) notes.push(`k1 is negative on token(s) ${negative.join(", ")} (where pi_ref > pi): `
        + "a single-sample KL penalty that rewards moving away");
    }
    return { logits, ref_logits: refLogits, probs, log_ratio: logRatio, per_token: perToken, exact_kl: exact,
      expected, num_samples: n, sample_mean: sampleMean, sample_std: sampleStd, notes };
  }

  // ======================================================================= length bias

  /** np.round: halves go to the even integer. */
  function roundHalfEven(x) {
    const r = Math.round(x);
    return r - x === 0.5 && r % 2 !== 0 ? r - 1 : r;
  }

  /** widgets/length_bias.py response_lengths: np.round(np.geomspace(shortest, longest, G)),
   * numpy's way: evenly spaced logs (start + i * step), 10 to their power, exact ends. */
  function responseLengths(G, shortest, longest) {
    const logStart = Math.log10(shortest), step = (Math.log10(longest) - logStart) / (G - 1);
    return Array.from({ length: G }, (_, i) => (i === 0 ? shortest : i === G - 1 ? longest
      : roundHalfEven(10 ** (i * step + logStart))));
  }

  /** grpo_edu.algorithm.aggregation.aggregation_weights for one token of each response (the registered divisors):
   * grpo divides by the response's length L and the G responses, dr_grpo by G times
   * max_completion_length, dapo and bnpo by the batch's token count. */
  const TOKEN_WEIGHTS = {
    grpo: (lengths) => lengths.map(L => 1 / L / lengths.length),
    dr_grpo: (lengths, maxLength) => lengths.map(() => 1 / (lengths.length * maxLength)),
    dapo: (lengths) => lengths.map(() => 1 / runningSum(lengths)),
    bnpo: (lengths) => lengths.map(() => 1 / runningSum(lengths)),
  };

  /** widgets/length_bias.py compute_state. */
  function computeLengthBias({ group_size: G, shortest, longest, max_completion_length: maxLength }, spec) {
    const lengths = responseLengths(G, shortest, longest);
    const weights = {}, totals = {}, ratio = {};
    for (const type of spec.loss_types) {
      weights[type] = TOKEN_WEIGHTS[type](lengths, maxLength);
      totals[type] = lengths.map((L, i) => L * weights[type][i]);
      ratio[type] = weights[type][0] / weights[type][G - 1];
    }
    const notes = [
      `grpo: a token of the ${lengths[0]}-token response counts ${fixed(ratio.grpo, 2)} times as much as a token `
      + `of the ${lengths[G - 1]}-token one; every response counts the same in total, so a long wrong answer is `
      + "penalised less per token (the length bias Dr. GRPO removes)",
      `dr_grpo: every token counts 1 / (G x ${maxLength}) = ${exp(weights.dr_grpo[0], 4)}, whatever its `
      + `response's length (ratio ${fixed(ratio.dr_grpo, 4)})`,
      `dapo / bnpo: every token counts 1 / (tokens in the batch) = 1 / ${runningSum(lengths)} = `
      + `${exp(weights.dapo[0], 4)} (ratio ${fixed(ratio.dapo, 4)})`,
    ];
    return { lengths, max_completion_length: maxLength, weights, totals, short_to_long: ratio, notes };
  }

  const compute = { advantage: computeAdvantage, clipping: computeClipping, kl: computeKL,
    length_bias: computeLengthBias };

  // ======================================================================= tables and notes
  // widgets/_base.py's table(), cell() and notes_html(), and each explorer's show().

  const PAD = "padding: 1px 8px";

  function escapeHtml(text) {                               // Python's html.escape
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;").replace(/'/g, "&#x27;");
  }

  function dataAttributes(data) {
    return Object.entries(data).map(([k, v]) => ` data-${k.replace(/_/g, "-")}="${escapeHtml(v)}"`).join("");
  }

  /** A cell that shows `value` rounded and carries it exactly in data-value. */
  function cell(value, css, digits = 4, data = {}) {
    return `<td class="${css}" data-value="${repr(value)}"${dataAttributes(data)} style="${PAD}">`
      + `${fmt(value, digits)}</td>`;
  }

  function table(css, header, rows) {
    const head = header.map(h => `<th style="${PAD}">${escapeHtml(h)}</th>`).join("");
    const body = rows.map(row => "<tr>" + row.map(c => (c.startsWith("<td") ? c
      : `<td style="${PAD}">${escapeHtml(c)}</td>`)).join("") + "</tr>").join("");
    return `<table class="grpo-table ${css}" style="border-collapse: collapse; font-family: monospace; `
      + `text-align: right"><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
  }

  function notesHtml(css, notes) {
    const items = notes.map(n => `<li>${escapeHtml(n)}</li>`).join("");
    return notes.length ? `<ul class="${css}" style="margin: 0.3em 0">${items}</ul>` : "";
  }

  const html = {
    advantage(state) {
      const rows = [];
      state.rewards.forEach((row, b) => row.forEach((reward, i) => rows.push([
        `${b + 1}`, `o${i + 1}`,
        cell(reward, "reward", 2, { prompt: b, response: i }),
        cell(state.advantages[b][i], "advantage", 4, { prompt: b, response: i }),
        i === 0 ? cell(state.means[b], "mean") : "",
        i === 0 ? cell(state.scales[b], "scale") : ""])));
      const header = ["prompt", "resp", "reward", "advantage", "mean", "std used"];
      return { table: table("grpo-advantage-table", header, rows),
        notes: notesHtml("grpo-advantage-notes", state.notes) };
    },
    clipping(state) {
      const t = state.tokens;
      const rows = state.token_labels.map((label, k) => [label, cell(t.ratio[k], "ratio"),
        cell(t.objective[k], "objective"), cell(t.gradient[k], "gradient"), t.clipped[k] ? "clipped" : "-"]);
      return { table: table("grpo-clipping-table", ["token", "rho", "objective", "d obj / d rho", "clipped"], rows),
        notes: notesHtml("grpo-clipping-notes", state.notes) };
    },
    kl(state, spec) {
      const rows = [["exact KL", cell(state.exact_kl, "exact-kl"), "", ""]];
      for (const name of spec.estimators) {
        rows.push([name, cell(state.expected[name], `expected ${name}`),
          cell(state.sample_mean[name], `sample-mean ${name}`), cell(state.sample_std[name], `sample-std ${name}`)]);
      }
      return { table: table("grpo-kl-table", ["", "E_pi[k] exact", `mean of ${state.num_samples}`, "std"], rows),
        notes: notesHtml("grpo-kl-notes", state.notes) };
    },
    length_bias(state, spec) {
      // length_bias._weight_cell: the weights in exponent format.
      const weightCell = (value, css, i) =>
        `<td class="${css}" data-value="${repr(value)}" data-response="${i}" style="${PAD}">${exp(value, 4)}</td>`;
      const types = spec.curves.map(([type]) => type);
      const header = ["length", ...types.map(t => `w ${t}`), ...types.map(t => `L x w ${t}`)];
      const rows = state.lengths.map((L, i) => [String(L),
        ...types.map(t => weightCell(state.weights[t][i], `weight ${t}`, i)),
        ...types.map(t => weightCell(state.totals[t][i], `total ${t}`, i))]);
      return { table: table("grpo-length-table", header, rows),
        notes: notesHtml("grpo-length-notes", state.notes) };
    },
  };

  // ======================================================================= SVG plots
  // A figure is one <svg> with two panels side by side, like the Python explorers' matplotlib
  // figures (90 dpi). A panel's frame (ticks, labels, title, legend, static curves) is
  // redrawn only when its limits change; its data layer, clipped to the axes, every update.

  const SVG_NS = "http://www.w3.org/2000/svg";
  const PX = 90 / 72;                                       // pixels per point at 90 dpi
  const MARGIN = { left: 48, right: 12, top: 22, bottom: 36 };
  const LEGEND_X = { "upper left": 0, "upper center": 0.5, "upper right": 1 };
  let clipIds = 0;

  /** `node` with these attributes and text, appended to `parent`. */
  function attach(node, attributes, parent, text) {
    for (const [k, v] of Object.entries(attributes || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }

  const svgNode = (tag, ...rest) => attach(document.createElementNS(SVG_NS, tag), ...rest);
  const element = (tag, ...rest) => attach(document.createElement(tag), ...rest);

  /** A matplotlib line style as SVG attributes: width in points, dash "--" or ":". */
  function stroke(colour, width = 1.5, dash = null) {
    const w = width * PX, pattern = { "--": [3.7, 1.6], ":": [1, 1.65] }[dash];
    return { stroke: colour, "stroke-width": w, fill: "none",
      ...(pattern && { "stroke-dasharray": pattern.map(p => p * w).join(",") }) };
  }

  const EDGE = { stroke: "black", "stroke-width": 0.5 * PX };   // scatter points' edge

  /** About 6 ticks at multiples of 1, 2, 2.5 or 5 x 10^k, as matplotlib's default locator. */
  function linearTicks([lo, hi]) {
    const raw = (hi - lo) / 6, power = 10 ** Math.floor(Math.log10(raw));
    const step = [1, 2, 2.5, 5, 10].map(m => m * power).find(s => s >= raw * (1 - 1e-9));
    const decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9)) + (step / power === 2.5 ? 1 : 0);
    const ticks = [];
    for (let k = Math.ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k++) {
      ticks.push([k * step + 0, fixed(k * step + 0, decimals).replace("-", "\u2212")]);
    }
    return ticks;
  }

  /** Whole decades 10^k inside [lo, hi], labelled by their exponent k. */
  function logTicks([lo, hi]) {
    const ticks = [];
    for (let k = Math.ceil(Math.log10(lo) - 1e-9); k <= Math.log10(hi) + 1e-9; k++) ticks.push([10 ** k, k]);
    return ticks;
  }

  class Panel {
    constructor(svg, box) {
      this.box = box;                                       // the axes: left, top, width, height
      const id = `grpo-clip-${++clipIds}`;
      svgNode("rect", { x: box.left, y: box.top, width: box.width, height: box.height },
        svgNode("clipPath", { id }, svg));
      this.frame = svgNode("g", {}, svg);                                // ticks, labels, title
      this.under = svgNode("g", { "clip-path": `url(#${id})` }, svg);   // static curves
      this.data = svgNode("g", { "clip-path": `url(#${id})` }, svg);
      this.over = svgNode("g", {}, svg);                                 // spines, legend
      this.key = null;
    }

    /** axes: x, y: [lo, hi]; xlog, ylog; title, xlabel; xticks: [[value, label]];
     * legend: {at: "upper left" | "upper center" | "upper right", entries: [{label, line,
     * patch, marker}]}; background(panel): draws static curves into panel.under. */
    setAxes(axes) {
      const key = JSON.stringify([axes.x, axes.y, axes.xticks]);
      if (key === this.key) return;
      this.key = key;
      this.axes = axes;
      for (const layer of [this.frame, this.under, this.over]) layer.replaceChildren();
      const { left, top, width, height } = this.box, bottom = top + height, centre = left + width / 2;
      const tick = { stroke: "black", "stroke-width": 0.8 * PX };
      for (const [value, label] of axes.xticks || (axes.xlog ? logTicks : linearTicks)(axes.x)) {
        const x = this.px(value);
        svgNode("line", { x1: x, x2: x, y1: bottom, y2: bottom + 4, ...tick }, this.frame);
        this.tickLabel(x, bottom + 15, label, axes.xlog, "middle");
      }
      for (const [value, label] of (axes.ylog ? logTicks : linearTicks)(axes.y)) {
        const y = this.py(value);
        svgNode("line", { x1: left - 4, x2: left, y1: y, y2: y, ...tick }, this.frame);
        this.tickLabel(left - 6, y + 4, label, axes.ylog, "end");
      }
      svgNode("text", { x: centre, y: top - 7, class: "grpo-title" }, this.frame, axes.title);
      if (axes.xlabel) {
        svgNode("text", { x: centre, y: bottom + 31, class: "grpo-axis-label" }, this.frame, axes.xlabel);
      }
      if (axes.background) axes.background(this);
      svgNode("rect", { x: left, y: top, width, height, fill: "none", ...tick }, this.over);
      if (axes.legend) this.legend(axes.legend);
    }

    /** A tick label; on a log axis, 10 with the exponent raised. */
    tickLabel(x, y, label, log, anchor) {
      const text = svgNode("text", { x, y, "text-anchor": anchor, class: "grpo-tick" }, this.frame, log ? "10" : label);
      if (log) svgNode("tspan", { dy: -5, "font-size": "75%" }, text, String(label).replace("-", "\u2212"));
    }

    legend({ at, entries }) {
      const width = 34 + 5.6 * Math.max(...entries.map(e => e.label.length)), height = 6 + 14 * entries.length;
      const x = this.box.left + 6 + (this.box.width - width - 12) * LEGEND_X[at], y = this.box.top + 6;
      svgNode("rect", { x, y, width, height, rx: 3, class: "grpo-legend" }, this.over);
      entries.forEach(({ label, line, patch, marker }, k) => {
        const cy = y + 10 + 14 * k;
        if (line) svgNode("line", { x1: x + 6, x2: x + 24, y1: cy, y2: cy, ...line }, this.over);
        if (patch) svgNode("rect", { x: x + 8, y: cy - 4, width: 14, height: 8, fill: patch }, this.over);
        if (marker) svgNode("circle", { cx: x + 15, cy, r: 3.5, ...marker }, this.over);
        svgNode("text", { x: x + 30, y: cy + 3.5, class: "grpo-legend-text" }, this.over, label);
      });
    }

    /** Where v lies between lo and hi, 0 to 1 (on a log scale: its log does). */
    static fraction(v, [lo, hi], log) {
      const t = log ? Math.log10 : (u => u);
      return (t(v) - t(lo)) / (t(hi) - t(lo));
    }

    px(v) { return this.box.left + this.box.width * Panel.fraction(v, this.axes.x, this.axes.xlog); }

    py(v) { return this.box.top + this.box.height * (1 - Panel.fraction(v, this.axes.y, this.axes.ylog)); }

    clear() { this.data.replaceChildren(); }

    line(xs, ys, style, layer = this.data) {
      const d = xs.map((x, i) => `${i ? "L" : "M"}${this.px(x).toFixed(2)},${this.py(ys[i]).toFixed(2)}`);
      svgNode("path", { d: d.join(""), ...style }, layer);
    }

    hline(y, style, layer = this.data) { this.line(this.axes.x, [y, y], style, layer); }

    vline(x, style) { this.line([x, x], this.axes.y, style); }

    /** The rectangle [x0, x1] x [y0, y1] in data coordinates. */
    rect(x0, x1, y0, y1, style) {
      const [left, right] = [this.px(x0), this.px(x1)].sort((a, b) => a - b);
      const [top, bottom] = [this.py(y0), this.py(y1)].sort((a, b) => a - b);
      svgNode("rect", { x: left, y: top, width: right - left, height: bottom - top, ...style }, this.data);
    }

    /** Circles at (xs[i], ys[i]) with radius(i) and fill(i) (pixels, colour). */
    points(xs, ys, radius, fill, edge = EDGE) {
      xs.forEach((x, i) => svgNode("circle",
        { cx: this.px(x), cy: this.py(ys[i]), r: radius(i), fill: fill(i), ...edge }, this.data));
    }

    /** Text at the bottom centre of the axes. */
    caption(text, colour) {
      const { left, top, width, height } = this.box;
      svgNode("text", { x: left + width / 2, y: top + height * 0.96 - 2, style: `fill: ${colour}`,
        class: "grpo-caption" }, this.data, text);
    }
  }

  function figure(container, [width, height]) {
    const svg = svgNode("svg", { viewBox: `0 0 ${width} ${height}`, width, height, class: "grpo-figure" }, container);
    return [0, 1].map(c => new Panel(svg, { left: c * width / 2 + MARGIN.left, top: MARGIN.top,
      width: width / 2 - MARGIN.left - MARGIN.right, height: height - MARGIN.top - MARGIN.bottom }));
  }

  // Axis limits that stay put while the data fits (widgets/_base.py): fewer jumps while dragging.

  /** The smallest of 1, 2, 5 x 10^k that is >= value (value > 0). */
  function niceLimit(value) {
    const power = 10 ** Math.floor(Math.log10(value));
    return [1, 2, 5, 10].map(m => m * power).find(limit => limit >= value * (1 - 1e-12));
  }

  function within(limit, value, slack) {
    if (limit > 0 && value > 0) return limit / value <= slack && value / limit <= slack;
    return Math.abs(limit) <= slack * Math.max(Math.abs(value), 1e-12);
  }

  function stickyLimits(current, low, high, propose, slack) {
    if (current) {
      const [bottom, top] = current;
      if (bottom <= low && high <= top && within(bottom, low, slack) && within(top, high, slack)) return current;
    }
    return propose(low, high);
  }

  function decadeLimits(low, high) {
    return [10 ** Math.floor(Math.log10(low)) / 2, 10 ** Math.ceil(Math.log10(high)) * 2];
  }

  function barLimits(low, high) {                           // kl.py's _bar_limits
    const top = niceLimit(high * 1.3);
    return [low < -top / 20 ? -niceLimit(-low * 1.3) : -top / 20, top];
  }

  const LIGHT_BLUE = "#9ecae1", BLUE = "#08519c", RED = "#a50f15";
  const ZERO = stroke("black", 0.8);
  const constant = value => () => value;

  const plots = {
    advantage(panels, state) {
      const G = state.rewards[0].length;
      const legend = { at: "upper right",
        entries: [{ label: "reward", patch: LIGHT_BLUE }, { label: "advantage", patch: BLUE }] };
      panels.forEach((panel, b) => {
        panel.setAxes({ x: [-0.6, G - 0.4], y: [-3, 3], title: `prompt ${b + 1}`,
          xticks: state.rewards[b].map((_, i) => [i, `o${i + 1}`]), legend: b === 0 && legend });
        panel.clear();
        state.rewards[b].forEach((reward, i) => {         // bars of width 0.4 either side of o_i
          panel.rect(i - 0.4, i, 0, reward, { fill: LIGHT_BLUE });
          panel.rect(i, i + 0.4, 0, state.advantages[b][i], { fill: BLUE });
        });
        panel.hline(0, ZERO);
        if (state.silent[b]) panel.caption("all rewards equal: teaches nothing", RED);
      });
    },

    clipping(panels, state, spec) {
      const [objectivePanel, gradientPanel] = panels, ratio = state.curve.ratio, xlabel = "rho = pi / pi_old";
      const dashed = stroke("grey", 1, "--");
      const legend = { at: "upper left", entries: [
        { label: "rho A", line: dashed },
        { label: "objective", line: stroke(BLUE, 2) },
        { label: "chapter 1's tokens", marker: { fill: "#6baed6", ...EDGE } }] };
      objectivePanel.setAxes({ x: spec.ratio_range, y: [-5.2, 5.2], title: "objective min(rho A, clip(rho) A)", xlabel,
        legend });
      gradientPanel.setAxes({ x: spec.ratio_range, y: [-2.6, 2.6], title: "d objective / d rho", xlabel });
      const tokenColour = i => (state.tokens.clipped[i] ? "#fb6a4a" : "#6baed6");
      const sides = [[objectivePanel, state.curve.objective, state.tokens.objective, BLUE],
        [gradientPanel, state.curve.gradient, state.tokens.gradient, RED]];
      for (const [panel, curve, tokens, colour] of sides) {
        panel.clear();
        if (state.no_gradient) {                            // shaded: where the gradient is 0
          const [low, high] = state.no_gradient;
          const shade = { fill: "#fdd0a2", "fill-opacity": 0.6 };
          panel.rect(low, Math.min(high, spec.ratio_range[1]), ...panel.axes.y, shade);
        }
        panel.hline(0, ZERO);
        panel.vline(1, stroke("grey", 0.8, ":"));
        if (panel === objectivePanel) panel.line(ratio, ratio.map(r => r * state.advantage), dashed);
        panel.line(ratio, curve, stroke(colour, 2));
        panel.points(state.tokens.ratio, tokens, constant(2.5 * PX), tokenColour);
      }
    },

    kl(panels, state, spec, memory) {
      const [curvePanel, barPanel] = panels, names = spec.estimators, grid = spec.log_ratio_grid;
      const colour = name => spec.colours[name];
      curvePanel.setAxes({ x: [grid[0], grid[grid.length - 1]], y: [-4, 6], xlabel: "d = log pi_ref(x) - log pi(x)",
        title: "per sample (dots: the 3 tokens, size ~ pi)",
        legend: { at: "upper center", entries: names.map(n => ({ label: n, line: stroke(colour(n)) })) },
        background: panel => {
          for (const n of names) panel.line(grid, grid.map(KL_ESTIMATORS[n]), stroke(colour(n)), panel.under);
          panel.hline(0, ZERO, panel.under);
        } });
      curvePanel.clear();
      const radius = x => Math.sqrt(20 + 200 * state.probs[x]) / 2 * PX;     // area 20 + 200 pi(x) points^2
      for (const n of names) curvePanel.points(state.log_ratio, state.per_token[n], radius, constant(colour(n)));

      const means = names.map(n => state.sample_mean[n]), stds = names.map(n => state.sample_std[n]);
      const high = Math.max(...means.map((m, i) => m + stds[i]), state.exact_kl, 1e-3);
      const low = Math.min(...means.map((m, i) => m - stds[i]), -high / 40);
      memory.ylim = stickyLimits(memory.ylim, low, high, barLimits, 6);
      barPanel.setAxes({ x: [-0.6, names.length - 0.4], y: memory.ylim, xticks: names.map((n, i) => [i, n]),
        title: "sample mean +- std vs exact KL",
        legend: { at: "upper right", entries: [{ label: "exact KL", line: stroke("black", 1.5, "--") }] } });
      barPanel.clear();
      barPanel.hline(0, ZERO);
      const error = stroke("black", 1.2);
      means.forEach((m, i) => {                             // the mean, +- one std with caps
        barPanel.rect(i - 0.3, i + 0.3, 0, m, { fill: colour(names[i]) });
        barPanel.line([i, i], [m - stds[i], m + stds[i]], error);
        for (const y of [m - stds[i], m + stds[i]]) barPanel.line([i - 0.08, i + 0.08], [y, y], error);
      });
      barPanel.hline(state.exact_kl, stroke("black", 1.5, "--"));
    },

    length_bias(panels, state, spec, memory) {
      memory.x = stickyLimits(memory.x, Math.min(...state.lengths), state.max_completion_length, decadeLimits, 30);
      memory.y = memory.y || [];
      const legend = { at: "upper right", entries: spec.curves.map(([type, colour]) =>
        ({ label: type === "dapo" ? "dapo / bnpo" : type, line: stroke(colour), marker: { fill: colour } })) };
      const sides = [[state.weights, "weight of one token"], [state.totals, "weight of the response (L x w)"]];
      sides.forEach(([values, title], k) => {
        const ys = spec.curves.flatMap(([type]) => values[type]);
        memory.y[k] = stickyLimits(memory.y[k], Math.min(...ys), Math.max(...ys), decadeLimits, 30);
        const panel = panels[k];
        panel.setAxes({ x: memory.x, y: memory.y[k], xlog: true, ylog: true, title,
          xlabel: "response length L (tokens)", legend: k === 0 && legend });
        panel.clear();
        for (const [type, colour] of spec.curves) {          // matplotlib's "o-"
          panel.line(state.lengths, values[type], stroke(colour));
          panel.points(state.lengths, values[type], constant(3 * PX), constant(colour), {});
        }
      });
    },
  };

  // ======================================================================= controls

  let controlIds = 0;

  /** A range input with its label and readout: `format` writes the readout, then `onInput`
   * runs, on every `input` event. The browser steps a range input in decimal, so its value
   * is already the decimal the Python slider holds ("0.9", not 0.8999999999999999). */
  function rangeInput(parent, css, { description, min, max, step, value }, format, onInput) {
    const wrap = element("div", { class: `grpo-slider ${css}-wrap` }, parent);
    const id = `grpo-control-${++controlIds}`;
    element("label", { for: id }, wrap, description);
    const input = element("input", { type: "range", id, class: css, min, max, step, value }, wrap);
    input.value = value;
    const output = element("output", { class: "grpo-readout", for: id }, wrap);
    const control = { wrap, input, value: () => Number(input.value),
      show: () => { output.textContent = format(Number(input.value)); } };
    input.addEventListener("input", () => { control.show(); onInput(); });
    control.show();
    return control;
  }

  /** An IntSlider or FloatSlider, its readout in the Python slider's readout_format. */
  function slider(parent, css, spec, onInput) {
    return rangeInput(parent, css, spec, v => readout(spec.readout_format, v), onInput);
  }

  /** A SelectionSlider: the range input runs over the options' index. */
  function selectionSlider(parent, css, { description, options, value }, onInput) {
    const control = rangeInput(parent, css, { description, min: 0, max: options.length - 1, step: 1,
      value: options.indexOf(value) }, i => String(options[i]), onInput);
    return { ...control, value: () => options[Number(control.input.value)] };
  }

  /** ToggleButtons: one pressed button at a time, its data-value the Python option's value. */
  function toggle(parent, css, { description, options, value }, onChange) {
    const wrap = element("div", { class: `grpo-toggle ${css}-wrap`, role: "group" }, parent);
    element("span", { class: "grpo-label" }, wrap, description);
    let current = value;
    const buttons = options.map(([label, option]) => element("button",
      { type: "button", class: css, "data-value": option, "aria-pressed": String(option === value) }, wrap, label));
    for (const button of buttons) {
      button.addEventListener("click", () => {
        current = button.dataset.value;
        for (const b of buttons) b.setAttribute("aria-pressed", String(b === button));
        onChange();
      });
    }
    return { value: () => current };
  }

  function box(parent, css) { return element("div", { class: css }, parent); }

  // Each layout builds its controls and boxes in the order of the Python explorer's
  // _assemble() and returns {config, table, notes, plot}.
  const layouts = {
    advantage(root, spec, update) {
      const c = spec.controls;
      const top = box(root, "grpo-controls");
      const G = slider(top, "grpo-control-G", c.G, () => { resize(G.value()); update(); });
      const shift = slider(top, "grpo-control-shift", c.shift, update);
      const scale = toggle(root, "grpo-control-scale", c.scale, update);
      const std = toggle(root, "grpo-control-std", c.std, update);
      const middle = box(root, "grpo-row");
      const rewardBox = box(middle, "grpo-rewards");
      const rewardSlider = (row, b, i, value) => {
        const control = slider(row, `grpo-reward-p${b}-r${i}`, { ...c.reward, description: `r${i + 1}`, value },
          update);
        control.wrap.classList.add("grpo-vertical");
        return control;
      };
      const prompts = spec.rewards.map((rewards, b) => {
        const row = box(rewardBox, "grpo-prompt");
        element("b", { class: "grpo-prompt-label" }, row, `prompt ${b + 1}`);
        return { row, sliders: rewards.map((r, i) => rewardSlider(row, b, i, r)) };
      });
      function resize(n) {                                 // AdvantageExplorer._resize
        prompts.forEach((prompt, b) => {
          while (prompt.sliders.length < n) {
            prompt.sliders.push(rewardSlider(prompt.row, b, prompt.sliders.length, spec.extra_reward));
          }
          for (const removed of prompt.sliders.splice(n)) removed.wrap.remove();
        });
      }
      const table = box(middle, "grpo-table-box");
      const plot = box(root, "grpo-plot"), notes = box(root, "grpo-notes-box");
      const config = () => ({ rewards: prompts.map(p => p.sliders.map(s => s.value())), scale: scale.value(),
        std: std.value(), shift: shift.value() });
      return { config, table, notes, plot };
    },

    clipping(root, spec, update) {
      const top = box(root, "grpo-controls");
      const sliders = {};
      for (const name of ["advantage", "epsilon_low", "epsilon_high"]) {
        sliders[name] = slider(top, `grpo-control-${name.replace("_", "-")}`, spec.controls[name], update);
      }
      const plot = box(root, "grpo-plot"), notes = box(root, "grpo-notes-box"), table = box(root, "grpo-table-box");
      const config = () => ({ advantage: sliders.advantage.value(), epsilon_low: sliders.epsilon_low.value(),
        epsilon_high: sliders.epsilon_high.value() });
      return { config, table, notes, plot };
    },

    kl(root, spec, update) {
      const c = spec.controls, top = box(root, "grpo-controls");
      const column = (title, controls, prefix) => {
        const col = box(top, "grpo-column");
        element("b", {}, col, title);
        return controls.map((control, x) => slider(col, `${prefix}${x}`, control, update));
      };
      const logits = column("pi (policy) logits", c.logits, "grpo-logit-x");
      const refLogits = column("pi_ref logits", c.ref_logits, "grpo-ref-logit-x");
      const samples = selectionSlider(top, "grpo-control-samples", c.samples, update);
      const plot = box(root, "grpo-plot"), table = box(root, "grpo-table-box"), notes = box(root, "grpo-notes-box");
      const config = () => ({ logits: logits.map(s => s.value()), ref_logits: refLogits.map(s => s.value()),
        num_samples: samples.value() });
      return { config, table, notes, plot };
    },

    length_bias(root, spec, update) {
      const c = spec.controls, top = box(root, "grpo-controls");
      const G = slider(top, "grpo-control-G", c.G, update);
      // The IntRangeSlider as two inputs. Its handles cannot cross: one dragged past the
      // other stops there.
      const stopAt = (moved, other, sign) => {
        if (sign * (moved.value() - other.value()) > 0) {
          moved.input.value = other.input.value;
          moved.show();
        }
        update();
      };
      const pair = box(top, "grpo-range"), [low, high] = c.lengths.value;
      const shortest = slider(pair, "grpo-control-shortest", { ...c.lengths, value: low },
        () => stopAt(shortest, longest, 1));
      const longest = slider(pair, "grpo-control-longest", { ...c.lengths, description: "to", value: high },
        () => stopAt(longest, shortest, -1));
      // No response is longer than the generation limit: the lengths' maximum follows it
      // (clamping them), as LengthBiasExplorer._limit_lengths.
      const maxLength = selectionSlider(top, "grpo-control-max-length", c.max_length, () => {
        for (const s of [shortest, longest]) {
          s.input.max = maxLength.value();
          s.input.value = Math.min(s.value(), maxLength.value());
          s.show();
        }
        update();
      });
      const plot = box(root, "grpo-plot"), notes = box(root, "grpo-notes-box"), table = box(root, "grpo-table-box");
      const config = () => ({ group_size: G.value(), shortest: shortest.value(), longest: longest.value(),
        max_completion_length: maxLength.value() });
      return { config, table, notes, plot };
    },
  };

  // ======================================================================= mounting

  /** Build the explorer of a `.grpo-live` element; element.grpoExplorer is its handle. */
  function mount(root) {
    if (root.grpoExplorer) return root.grpoExplorer;
    const kind = root.dataset.explorer;
    if (!Object.hasOwn(compute, kind)) {
      throw new Error(`data-explorer must be one of ${Object.keys(compute).join(", ")}, got ${JSON.stringify(kind)}`);
    }
    const specNode = root.querySelector("script.grpo-explorer-spec");
    if (!specNode) throw new Error(`the ${kind} explorer has no <script class="grpo-explorer-spec"> inside it`);
    const spec = JSON.parse(specNode.textContent);
    root.classList.add("grpo-explorer", spec.css);

    const explorer = { kind, spec, state: null, updates: 0, lastUpdateMs: null, html: null };
    const memory = {};                                      // the plot's sticky axis limits
    const parts = layouts[kind](root, spec, () => explorer.update());
    const panels = figure(parts.plot, spec.figure);      // the Python figure's size in pixels
    explorer.config = parts.config;
    explorer.update = () => {
      const start = performance.now();
      const state = compute[kind](parts.config(), spec);
      const rendered = html[kind](state, spec);
      parts.table.innerHTML = rendered.table;
      parts.notes.innerHTML = rendered.notes;
      plots[kind](panels, state, spec, memory);
      explorer.state = state;
      explorer.html = rendered;
      explorer.updates += 1;
      explorer.lastUpdateMs = performance.now() - start;
    };
    root.grpoExplorer = explorer;
    explorer.update();
    return explorer;
  }

  /** Mount every `.grpo-live` element; one that fails says so in place and in the console. */
  function mountAll() {
    for (const root of document.querySelectorAll(".grpo-live")) {
      try {
        mount(root);
      } catch (error) {
        element("p", { class: "grpo-explorer-error" }, root, `This explorer could not start: ${error.message}`);
        console.error(error);
      }
    }
  }

  window.GrpoExplorers = { compute, html, format: { fixed, exp, fmt, repr, readout }, mount, mountAll };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", mountAll);
  else mountAll();
})();
